#pragma once
// Checks of schedule tables shared by the schedule tests (test_schedule.cpp, test_schedule_zbv.cpp):
// every rank's table on its own (each forward and backward exactly once, forward before backward,
// receives before the computation that needs them or, at ZB-V's turn, the same rank's chunk before it,
// sends after the one that produced them, each transfer to the neighbouring stage's rank) and all
// ranks' tables simulated together: a batch of sends/receives completes when every op in it meets its
// counterpart in the peer's current batch (the k-th send a→b with the k-th receive b←a, which must
// describe the same transfer). The simulation must finish: no deadlock.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline {

namespace schedule_checks {

struct Transfer {
  bool forward;   // activation (true) or gradient
  int micro;
  int fromStage;  // the producing stage: fwd s → s+1, bwd s → s−1
};

// The transfer an op moves, in global (stage) terms.
inline Transfer transferOf(const Schedule& s, int rank, const CommAction& c) {
  int st = s.stageOf(rank, c.chunk);
  switch (c.kind) {
    case CommKind::SendForward: return {true, c.micro, st};
    case CommKind::RecvForward: return {true, c.micro, st - 1};
    case CommKind::SendBackward: return {false, c.micro, st};
    case CommKind::RecvBackward: return {false, c.micro, st + 1};
  }
  return {};
}

// Per-rank checks: returns "" or what is wrong.
inline std::string checkRank(const Schedule& s, int r) {
  std::set<std::pair<int, int>> fwd, bwd, wgt, recvF, recvB;
  for (const auto& a : s.ranks[r]) {
    auto key = std::make_pair(a.micro, a.chunk);
    if (a.kind == Action::WeightGrad) {
      if (!s.splitsBackward()) return fmt::format("W m{} c{} in a schedule that does not split backward", a.micro, a.chunk);
      if (!bwd.count(key)) return fmt::format("W m{} c{} before its B", a.micro, a.chunk);
      if (!wgt.insert(key).second) return fmt::format("W m{} c{} twice", a.micro, a.chunk);
    } else if (a.kind == Action::Forward) {
      if (!fwd.insert(key).second) return fmt::format("F m{} c{} twice", a.micro, a.chunk);
      const int lp = s.localPrevChunk(r, a.chunk);  // ZB-V's turn: handed over on the rank
      if (lp >= 0 && !fwd.count({a.micro, lp}))
        return fmt::format("F m{} c{} before the forward of chunk {} that feeds it", a.micro, a.chunk, lp);
      if (lp < 0 && !s.isFirstStage(r, a.chunk) && !recvF.count(key))
        return fmt::format("F m{} c{} before its input was received", a.micro, a.chunk);
    } else if (a.kind == Action::Backward) {
      if (!fwd.count(key)) return fmt::format("B m{} c{} before its forward", a.micro, a.chunk);
      if (!bwd.insert(key).second) return fmt::format("B m{} c{} twice", a.micro, a.chunk);
      const int ln = s.localNextChunk(r, a.chunk);
      if (ln >= 0 && !bwd.count({a.micro, ln}))
        return fmt::format("B m{} c{} before the backward of chunk {} that feeds it", a.micro, a.chunk, ln);
      if (ln < 0 && !s.isLastStage(r, a.chunk) && !recvB.count(key))
        return fmt::format("B m{} c{} before its output gradient was received", a.micro, a.chunk);
    } else {
      for (const auto& c : a.comm) {
        auto k = std::make_pair(c.micro, c.chunk);
        if (c.kind == CommKind::SendForward && !fwd.count(k)) return "send-fwd before its forward";
        if (c.kind == CommKind::SendBackward && !bwd.count(k)) return "send-bwd before its backward";
        if (c.kind == CommKind::RecvForward) recvF.insert(k);
        if (c.kind == CommKind::RecvBackward) recvB.insert(k);
        const bool toNext = c.kind == CommKind::SendForward || c.kind == CommKind::RecvBackward;
        const int st = s.stageOf(r, c.chunk);
        const int want = s.rankOfStage(toNext ? st + 1 : st - 1);  // the neighbouring stage's rank
        if (c.peer != want) return fmt::format("{} m{} peer {} (want {})", toString(c.kind), c.micro, c.peer, want);
      }
    }
  }
  size_t n = static_cast<size_t>(s.numMicro * s.chunks);
  if (fwd.size() != n || bwd.size() != n) return fmt::format("{} forwards, {} backwards (want {})", fwd.size(), bwd.size(), n);
  if (wgt.size() != (s.splitsBackward() ? n : 0)) return fmt::format("{} weight-gradient passes", wgt.size());
  return "";
}

// Simulates every rank's table together; returns "" when all ranks finish.
inline std::string simulate(const Schedule& s) {
  const int P = s.pp;
  // Static numbering: (rank, tick, index in batch) → k-th send to / recv from that peer.
  std::map<std::tuple<int, int, int>, int> seqOf;
  std::map<std::tuple<int, int, bool, int>, std::tuple<int, int, int>> where;  // (rank, peer, send, k) → (r, tick, i)
  for (int r = 0; r < P; ++r) {
    std::map<std::pair<int, bool>, int> count;
    for (int t = 0; t < (int)s.ranks[r].size(); ++t) {
      const auto& a = s.ranks[r][t];
      for (int i = 0; i < (int)a.comm.size(); ++i) {
        bool snd = isSend(a.comm[i].kind);
        int k = count[{a.comm[i].peer, snd}]++;
        seqOf[{r, t, i}] = k;
        where[{r, a.comm[i].peer, snd, k}] = {r, t, i};
      }
    }
  }
  // Pairing: the k-th send a→b against the k-th recv b←a.
  for (const auto& [key, loc] : where) {
    auto [r, peer, snd, k] = key;
    auto it = where.find({peer, r, !snd, k});
    if (it == where.end()) return fmt::format("rank {}'s {}-th {} {} has no counterpart", r, k, snd ? "send to" : "recv from", peer);
    if (!snd) continue;
    auto [r1, t1, i1] = loc;
    auto [r2, t2, i2] = it->second;
    auto a = transferOf(s, r1, s.ranks[r1][t1].comm[i1]), b = transferOf(s, r2, s.ranks[r2][t2].comm[i2]);
    if (a.forward != b.forward || a.micro != b.micro || a.fromStage != b.fromStage)
      return fmt::format("rank {}'s {}-th send to {} ({} m{} from stage {}) meets a receive of ({} m{} from stage {})", r, k, peer,
                         a.forward ? "fwd" : "bwd", a.micro, a.fromStage, b.forward ? "fwd" : "bwd", b.micro, b.fromStage);
  }
  std::vector<int> pc(P, 0);
  std::vector<std::vector<bool>> done(P);
  auto posted = [&](int r, int t) { return pc[r] == t; };
  for (;;) {
    bool progress = false, finished = true;
    for (int r = 0; r < P; ++r) {
      while (pc[r] < (int)s.ranks[r].size() && s.ranks[r][pc[r]].kind != Action::Comm) ++pc[r], progress = true;
      if (pc[r] == (int)s.ranks[r].size()) continue;
      finished = false;
      const auto& a = s.ranks[r][pc[r]];
      if (done[r].size() != a.comm.size()) done[r].assign(a.comm.size(), false);
      for (int i = 0; i < (int)a.comm.size(); ++i) {
        if (done[r][i]) continue;
        auto [pr, pt, pi] = where[{a.comm[i].peer, r, !isSend(a.comm[i].kind), seqOf[{r, pc[r], i}]}];
        if (!posted(pr, pt)) continue;
        if (done[pr].size() != s.ranks[pr][pt].comm.size()) done[pr].assign(s.ranks[pr][pt].comm.size(), false);
        done[r][i] = done[pr][pi] = true;
        progress = true;
      }
      if (std::all_of(done[r].begin(), done[r].end(), [](bool b) { return b; })) {
        ++pc[r];
        done[r].clear();
        progress = true;
      }
    }
    if (finished) return "";
    if (!progress) {
      std::string m = "deadlock:";
      for (int r = 0; r < P; ++r)
        m += fmt::format(" rank {} at tick {}/{};", r, pc[r], s.ranks[r].size());
      return m;
    }
  }
}

inline void checkAll(ScheduleKind kind, int pp, int M, int V, int extra = 0) {
  auto s = makeSchedule(kind, pp, M, V, extra);
  std::string where = fmt::format("{} pp={} M={} chunks={} extra warm-up={}", toString(kind), pp, M, V, extra);
  for (int r = 0; r < pp; ++r) {
    auto err = checkRank(s, r);
    EXPECT_EQ(err, "") << where << " rank " << r << "\n" << s.describe(r);
    if (kind == ScheduleKind::OneFOneB)
      EXPECT_LE(s.peakInFlight(r), oneFOneBBound(pp, r, M, extra)) << where << " rank " << r;
    if (kind == ScheduleKind::GPipe) EXPECT_EQ(s.peakInFlight(r), M) << where;
    if (kind == ScheduleKind::ZeroBubbleH1) EXPECT_EQ(s.peakInFlight(r), std::min(pp, M)) << where << " rank " << r;
    if (kind == ScheduleKind::ZeroBubbleV) EXPECT_LE(s.peakInFlight(r), 2 * pp) << where << " rank " << r;
  }
  auto err = simulate(s);
  EXPECT_EQ(err, "") << where;
}

// fn() throws a tessera::Error whose message holds every one of parts.
template <typename Fn>
void expectError(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

}  // namespace schedule_checks

}  // namespace tessera::pipeline
