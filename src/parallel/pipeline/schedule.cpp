#include "tessera/parallel/pipeline/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "common/choice.h"
#include "parallel/pipeline/zero_bubble_v.h"
#include "tessera/common/error.h"

namespace tessera::pipeline {

const char* toString(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "GPipe";
    case ScheduleKind::OneFOneB: return "1F1B";
    case ScheduleKind::Interleaved1F1B: return "interleaved 1F1B";
    case ScheduleKind::ZeroBubbleH1: return "ZB-H1";
    case ScheduleKind::ZeroBubbleV: return "ZB-V";
  }
  return "?";
}

namespace {
constexpr Choices<ScheduleKind, 5> kScheduleNames{"pipeline schedule",
                                                  {{{ScheduleKind::OneFOneB, "1f1b"},
                                                    {ScheduleKind::GPipe, "gpipe"},
                                                    {ScheduleKind::Interleaved1F1B, "interleaved"},
                                                    {ScheduleKind::ZeroBubbleH1, "zb-h1"},
                                                    {ScheduleKind::ZeroBubbleV, "zbv"}}}};
}  // namespace

ScheduleKind parseScheduleKind(const std::string& s) { return kScheduleNames.parse(s); }
const char* scheduleName(ScheduleKind k) { return kScheduleNames.name(k); }

const char* toString(CommKind k) {
  switch (k) {
    case CommKind::SendForward: return "send-fwd";
    case CommKind::RecvForward: return "recv-fwd";
    case CommKind::SendBackward: return "send-bwd";
    case CommKind::RecvBackward: return "recv-bwd";
  }
  return "?";
}

bool isSend(CommKind k) { return k == CommKind::SendForward || k == CommKind::SendBackward; }

int Schedule::localPrevChunk(int rank, int chunk) const {
  const int s = stageOf(rank, chunk);
  return s > 0 && rankOfStage(s - 1) == rank ? chunkOfStage(s - 1) : -1;
}

int Schedule::localNextChunk(int rank, int chunk) const {
  const int s = stageOf(rank, chunk);
  return s < numStages() - 1 && rankOfStage(s + 1) == rank ? chunkOfStage(s + 1) : -1;
}

int oneFOneBBound(int pp, int rank, int numMicro, int extraWarmup) {
  return std::min(pp - rank + (rank < pp - 1 ? extraWarmup : 0), numMicro);
}

namespace {

Action compute(Action::Kind k, int micro, int chunk) {
  Action a;
  a.kind = k;
  a.micro = micro;
  a.chunk = chunk;
  return a;
}

// The order of computations on `rank` (no communication yet).
std::vector<Action> computeOrder(ScheduleKind kind, int pp, int rank, int M, int V, int extra) {
  std::vector<Action> out;
  auto F = [&](int m, int c) { out.push_back(compute(Action::Forward, m, c)); };
  auto B = [&](int m, int c) { out.push_back(compute(Action::Backward, m, c)); };
  if (kind == ScheduleKind::ZeroBubbleH1) {
    // 1F1B's order with B for the backward; W of micro-batch m after B of m + rank.
    const int warm = std::min(pp - rank - 1, M);
    int nb = 0, nw = 0;
    auto BW = [&] {
      B(nb++, 0);
      if (nb - nw > rank) out.push_back(compute(Action::WeightGrad, nw++, 0));
    };
    for (int m = 0; m < warm; ++m) F(m, 0);
    for (int i = 0; i < M - warm; ++i) {
      F(warm + i, 0);
      BW();
    }
    while (nb < M) BW();
    while (nw < M) out.push_back(compute(Action::WeightGrad, nw++, 0));
    return out;
  }
  if (kind == ScheduleKind::GPipe) {
    for (int m = 0; m < M; ++m) F(m, 0);
    for (int m = 0; m < M; ++m) B(m, 0);
    return out;
  }
  if (kind == ScheduleKind::OneFOneB) {
    int warm = std::min(pp - rank - 1 + (rank < pp - 1 ? extra : 0), M);
    for (int m = 0; m < warm; ++m) F(m, 0);
    for (int i = 0; i < M - warm; ++i) {
      F(warm + i, 0);
      B(i, 0);
    }
    for (int m = M - warm; m < M; ++m) B(m, 0);
    return out;
  }
  // Interleaved (Megatron's forward_backward_pipelining_with_interleaving): the k-th
  // virtual micro-batch is micro-batch (k / (pp·V))·pp + k % pp of chunk (k / pp) % V
  // (backward: chunks in reverse).
  const int total = M * V;
  auto micro = [&](int k) { return (k / (pp * V)) * pp + k % pp; };
  auto chunk = [&](int k, bool fwd) {
    int c = (k % (pp * V)) / pp;
    return fwd ? c : V - 1 - c;
  };
  int warm = M == pp ? total : std::min((pp - rank - 1) * 2 + (V - 1) * pp, total);
  for (int k = 0; k < warm; ++k) F(micro(k), chunk(k, true));
  for (int i = 0; i < total - warm; ++i) {
    F(micro(warm + i), chunk(warm + i, true));
    B(micro(i), chunk(i, false));
  }
  for (int k = total - warm; k < total; ++k) B(micro(k), chunk(k, false));
  return out;
}

// Places the communication by simulating all ranks in lock-step ticks: in each tick every
// rank runs its next computation if its input (or output gradient) has arrived in an earlier
// tick; then every rank issues one batch holding the sends of what it computed in this tick
// and the receives of what its neighbours computed in this tick, in one global order. A
// tick's batches pair only with the same tick's batches, and a tick's computations need only
// earlier ticks' batches, so the tables cannot deadlock (test_schedule checks it anyway).
void placeCommunication(Schedule& s) {
  const int P = s.pp, S = s.numStages();
  std::vector<std::vector<Action>> order(P);
  std::vector<size_t> pos(P, 0);
  // have[r][c * M + m]: bit 0 input arrived, bit 1 output gradient arrived, bit 2 forward done,
  // bit 3 backward (B) done.
  std::vector<std::vector<int>> have(P, std::vector<int>(s.chunks * s.numMicro, 0));
  if (s.kind == ScheduleKind::ZeroBubbleV) {
    order = detail::zeroBubbleVOrders(P, s.numMicro);
  } else {
    for (int r = 0; r < P; ++r) order[r] = computeOrder(s.kind, P, r, s.numMicro, s.chunks, s.extraWarmup);
  }
  s.ranks.assign(P, {});
  struct Move {
    bool fwd;
    int from, to, micro, fromChunk, toChunk;
  };
  for (;;) {
    std::vector<Move> moves;
    bool busy = false, progress = false;
    for (int r = 0; r < P; ++r) {
      if (pos[r] == order[r].size()) continue;
      busy = true;
      const Action& a = order[r][pos[r]];
      const int st = s.stageOf(r, a.chunk);
      int& h = have[r][a.chunk * s.numMicro + a.micro];
      bool ready = a.kind == Action::Forward    ? (st == 0 || (h & 1))
                   : a.kind == Action::Backward ? ((h & 4) && (st == S - 1 || (h & 2)))
                                                : (h & 8) != 0;  // W after its B
      if (!ready) continue;
      progress = true;
      s.ranks[r].push_back(a);
      ++pos[r];
      if (a.kind == Action::Forward) h |= 4;
      if (a.kind == Action::Backward) h |= 8;
      if (a.kind == Action::Forward && st < S - 1)
        moves.push_back({true, r, s.rankOfStage(st + 1), a.micro, a.chunk, s.chunkOfStage(st + 1)});
      if (a.kind == Action::Backward && st > 0)
        moves.push_back({false, r, s.rankOfStage(st - 1), a.micro, a.chunk, s.chunkOfStage(st - 1)});
    }
    if (!busy) return;
    TESSERA_CHECK(progress, "pipeline schedule: internal error: the {} compute order for pp = {}, {} micro-batches, "
                  "{} chunks cannot proceed", toString(s.kind), P, s.numMicro, s.chunks);
    if (moves.empty()) continue;
    std::vector<Action> batch(P);
    for (auto& b : batch) b.kind = Action::Comm;
    for (const auto& mv : moves) {  // already in a global order (by sender, one move each)
      if (mv.from == mv.to) {  // ZB-V's turn: handed over on the rank (the executor), arrived next tick
        have[mv.to][mv.toChunk * s.numMicro + mv.micro] |= mv.fwd ? 1 : 2;
        continue;
      }
      batch[mv.from].comm.push_back(
          {mv.fwd ? CommKind::SendForward : CommKind::SendBackward, mv.micro, mv.fromChunk, mv.to});
      batch[mv.to].comm.push_back({mv.fwd ? CommKind::RecvForward : CommKind::RecvBackward, mv.micro, mv.toChunk, mv.from});
      have[mv.to][mv.toChunk * s.numMicro + mv.micro] |= mv.fwd ? 1 : 2;
    }
    for (int r = 0; r < P; ++r)
      if (!batch[r].comm.empty()) s.ranks[r].push_back(std::move(batch[r]));
  }
}

}  // namespace

Schedule makeSchedule(ScheduleKind kind, int pp, int M, int V, int extraWarmup) {
  TESSERA_CHECK(pp >= 1, "pipeline schedule: pp = {} (must be >= 1)", pp);
  TESSERA_CHECK(extraWarmup >= 0, "pipeline schedule: extra warm-up of {} forwards (must be >= 0)", extraWarmup);
  TESSERA_CHECK(extraWarmup == 0 || kind == ScheduleKind::OneFOneB,
                "pipeline schedule: extra warm-up forwards ({}) are for 1F1B only, not {}", extraWarmup, toString(kind));
  TESSERA_CHECK(M >= 1, "pipeline schedule: {} micro-batches (must be >= 1)", M);
  if (kind == ScheduleKind::ZeroBubbleV) {
    TESSERA_CHECK(V == 2, "ZB-V runs two chunks per rank (a V), got {}", V);
    TESSERA_CHECK(pp >= 2, "ZB-V needs pp >= 2, got pp = {}", pp);
  } else if (kind == ScheduleKind::Interleaved1F1B) {
    TESSERA_CHECK(V >= 2, "interleaved 1F1B needs at least 2 virtual stages (chunks) per rank, got {}", V);
    TESSERA_CHECK(pp >= 2, "interleaved 1F1B needs pp >= 2, got pp = {}", pp);
    TESSERA_CHECK(M % pp == 0,
                  "interleaved 1F1B needs the number of micro-batches to be a multiple of pp: {} micro-batches, "
                  "pp = {}",
                  M, pp);
  } else {
    TESSERA_CHECK(V == 1, "{} takes one chunk per rank, got {} (use interleaved 1F1B for virtual stages)",
                  toString(kind), V);
  }
  TESSERA_CHECK((kind != ScheduleKind::OneFOneB && kind != ScheduleKind::ZeroBubbleH1 &&
                 kind != ScheduleKind::ZeroBubbleV) || M >= pp,
                "{} needs at least as many micro-batches as pipeline stages: {} micro-batches, pp = {} "
                "(use more micro-batches, or GPipe)",
                toString(kind), M, pp);

  Schedule s;
  s.kind = kind;
  s.pp = pp;
  s.numMicro = M;
  s.chunks = V;
  s.extraWarmup = extraWarmup;
  placeCommunication(s);
  return s;
}

int Schedule::peakInFlight(int rank) const {
  int cur = 0, peak = 0;
  const auto done = splitsBackward() ? Action::WeightGrad : Action::Backward;
  for (const auto& a : ranks.at(rank)) {
    if (a.kind == Action::Forward) peak = std::max(peak, ++cur);
    if (a.kind == done) --cur;
  }
  return peak;
}

std::string Schedule::describe(int rank) const {
  std::string out;
  for (const auto& a : ranks.at(rank)) {
    if (a.kind == Action::Comm) {
      std::vector<std::string> parts;
      for (const auto& c : a.comm)
        parts.push_back(fmt::format("{} m{} c{} {} {}", toString(c.kind), c.micro, c.chunk, isSend(c.kind) ? "->" : "<-",
                                    c.peer));
      out += fmt::format("comm [{}]\n", fmt::join(parts, ", "));
    } else {
      const char* k = a.kind == Action::Forward ? "F" : a.kind == Action::Backward ? "B" : "W";
      out += fmt::format("{} m{} c{}\n", k, a.micro, a.chunk);
    }
  }
  return out;
}

}  // namespace tessera::pipeline
