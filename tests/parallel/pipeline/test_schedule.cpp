// Schedule tables without any device or process: for GPipe, 1F1B and interleaved 1F1B over
// pp 1..4 and 1..8 micro-batches (where valid), every rank's table is checked on its own
// (each forward and backward exactly once, forward before backward, receives before the
// computation that needs them, sends after the one that produced them) and all ranks'
// tables are simulated together: a batch of sends/receives completes when every op in it
// meets its counterpart in the peer's current batch (the k-th send a→b with the k-th
// receive b←a, which must describe the same transfer). The simulation must finish: no
// deadlock. 1F1B keeps at most pp − rank micro-batches in flight; ZB-H1 (backward split into B
// and W) runs each W once, after its B, and keeps min(pp, M) in flight (until W) on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/schedule.h"

using namespace tessera::pipeline;

namespace {

struct Transfer {
  bool forward;   // activation (true) or gradient
  int micro;
  int fromStage;  // the producing stage: fwd s → s+1, bwd s → s−1
};

// The transfer an op moves, in global (stage) terms.
Transfer transferOf(const Schedule& s, int rank, const CommAction& c) {
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
std::string checkRank(const Schedule& s, int r) {
  std::set<std::pair<int, int>> fwd, bwd, wgt, recvF, recvB;
  for (const auto& a : s.ranks[r]) {
    auto key = std::make_pair(a.micro, a.chunk);
    if (a.kind == Action::WeightGrad) {
      if (!s.splitsBackward()) return fmt::format("W m{} c{} in a schedule that does not split backward", a.micro, a.chunk);
      if (!bwd.count(key)) return fmt::format("W m{} c{} before its B", a.micro, a.chunk);
      if (!wgt.insert(key).second) return fmt::format("W m{} c{} twice", a.micro, a.chunk);
    } else if (a.kind == Action::Forward) {
      if (!fwd.insert(key).second) return fmt::format("F m{} c{} twice", a.micro, a.chunk);
      if (!s.isFirstStage(r, a.chunk) && !recvF.count(key))
        return fmt::format("F m{} c{} before its input was received", a.micro, a.chunk);
    } else if (a.kind == Action::Backward) {
      if (!fwd.count(key)) return fmt::format("B m{} c{} before its forward", a.micro, a.chunk);
      if (!bwd.insert(key).second) return fmt::format("B m{} c{} twice", a.micro, a.chunk);
      if (!s.isLastStage(r, a.chunk) && !recvB.count(key))
        return fmt::format("B m{} c{} before its output gradient was received", a.micro, a.chunk);
    } else {
      for (const auto& c : a.comm) {
        auto k = std::make_pair(c.micro, c.chunk);
        if (c.kind == CommKind::SendForward && !fwd.count(k)) return "send-fwd before its forward";
        if (c.kind == CommKind::SendBackward && !bwd.count(k)) return "send-bwd before its backward";
        if (c.kind == CommKind::RecvForward) recvF.insert(k);
        if (c.kind == CommKind::RecvBackward) recvB.insert(k);
        bool toNext = c.kind == CommKind::SendForward || c.kind == CommKind::RecvBackward;
        int want = toNext ? (r + 1) % s.pp : (r + s.pp - 1) % s.pp;
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
std::string simulate(const Schedule& s) {
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

void checkAll(ScheduleKind kind, int pp, int M, int V, int extra = 0) {
  auto s = makeSchedule(kind, pp, M, V, extra);
  std::string where = fmt::format("{} pp={} M={} chunks={} extra warm-up={}", toString(kind), pp, M, V, extra);
  for (int r = 0; r < pp; ++r) {
    auto err = checkRank(s, r);
    EXPECT_EQ(err, "") << where << " rank " << r << "\n" << s.describe(r);
    if (kind == ScheduleKind::OneFOneB)
      EXPECT_LE(s.peakInFlight(r), oneFOneBBound(pp, r, M, extra)) << where << " rank " << r;
    if (kind == ScheduleKind::GPipe) EXPECT_EQ(s.peakInFlight(r), M) << where;
    if (kind == ScheduleKind::ZeroBubbleH1) EXPECT_EQ(s.peakInFlight(r), std::min(pp, M)) << where << " rank " << r;
  }
  auto err = simulate(s);
  EXPECT_EQ(err, "") << where;
}

}  // namespace

TEST(Schedule, GPipeTablesAreValidAndDeadlockFree) {
  for (int pp = 1; pp <= 4; ++pp)
    for (int M = 1; M <= 8; ++M) checkAll(ScheduleKind::GPipe, pp, M, 1);
}

TEST(Schedule, OneFOneBTablesAreValidDeadlockFreeAndBounded) {
  for (int pp = 1; pp <= 4; ++pp)
    for (int M = pp; M <= 8; ++M)
      for (int extra = 0; extra <= 3; ++extra) checkAll(ScheduleKind::OneFOneB, pp, M, 1, extra);
}

TEST(Schedule, OneFOneBExtraWarmUpOnEveryRankButTheLast) {
  const int pp = 3, M = 8, extra = 2;
  auto s = makeSchedule(ScheduleKind::OneFOneB, pp, M, 1, extra);
  for (int r = 0; r < pp; ++r) {
    int warm = 0;
    for (const auto& a : s.ranks[r]) {
      if (a.kind == Action::Backward) break;
      if (a.kind == Action::Forward) ++warm;
    }
    const int want = pp - r - 1 + (r < pp - 1 ? extra : 0);
    EXPECT_EQ(warm, want + 1) << "rank " << r;  // + the first steady forward
    EXPECT_EQ(s.peakInFlight(r), want + 1) << "rank " << r;
    EXPECT_EQ(oneFOneBBound(pp, r, M, extra), want + 1) << "rank " << r;
  }
  // The warm-up never exceeds the micro-batches: all forwards first, as GPipe.
  auto all = makeSchedule(ScheduleKind::OneFOneB, 2, 2, 1, 3);
  EXPECT_EQ(all.peakInFlight(0), 2);
  EXPECT_EQ(oneFOneBBound(2, 0, 2, 3), 2);
}

TEST(Schedule, OneFOneBWarmUpIsPpMinusRankMinusOne) {
  auto s = makeSchedule(ScheduleKind::OneFOneB, 4, 8);
  for (int r = 0; r < 4; ++r) {
    int warm = 0;
    for (const auto& a : s.ranks[r]) {
      if (a.kind == Action::Backward) break;
      if (a.kind == Action::Forward) ++warm;
    }
    EXPECT_EQ(warm, 4 - r - 1 + 1) << "rank " << r;  // warm-up forwards + the first steady forward
    EXPECT_EQ(s.peakInFlight(r), 4 - r);
  }
}

TEST(Schedule, InterleavedWarmUpIsMegatrons) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int M : {pp, 2 * pp}) {
      const int V = 2, total = M * V;
      auto s = makeSchedule(ScheduleKind::Interleaved1F1B, pp, M, V);
      for (int r = 0; r < pp; ++r) {
        int want = M == pp ? total : std::min((pp - r - 1) * 2 + (V - 1) * pp, total);
        int fwdBeforeFirstB = 0;
        for (const auto& a : s.ranks[r]) {
          if (a.kind == Action::Backward) break;
          if (a.kind == Action::Forward) ++fwdBeforeFirstB;
        }
        EXPECT_EQ(fwdBeforeFirstB, want + (want < total ? 1 : 0)) << "pp " << pp << " M " << M << " rank " << r;
        EXPECT_EQ(s.peakInFlight(r), want + (want < total ? 1 : 0)) << "pp " << pp << " M " << M << " rank " << r;
      }
    }
}

TEST(Schedule, InterleavedTablesAreValidAndDeadlockFree) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int V = 2; V <= 3; ++V)
      for (int M = pp; M <= 8; M += pp) checkAll(ScheduleKind::Interleaved1F1B, pp, M, V);
}

TEST(Schedule, ZeroBubbleH1TablesAreValidDeadlockFreeAndBounded) {
  for (int pp = 1; pp <= 4; ++pp)
    for (int M = pp; M <= 8; ++M) checkAll(ScheduleKind::ZeroBubbleH1, pp, M, 1);
}

TEST(Schedule, ZeroBubbleH1IsOneFOneBWithWPostponedByTheRank) {
  auto s = makeSchedule(ScheduleKind::ZeroBubbleH1, 4, 8);
  auto computeOrder = [&](int r) {
    std::string out;
    for (const auto& a : s.ranks[r]) {
      if (a.kind == Action::Comm) continue;
      out += fmt::format("{}{} ", a.kind == Action::Forward ? 'F' : a.kind == Action::Backward ? 'B' : 'W', a.micro);
    }
    return out;
  };
  // Rank 0: 1F1B's warm-up of 3, each W right after its B.
  EXPECT_EQ(computeOrder(0), "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7 ");
  // Rank 2: W of micro-batch m after B of m + 2.
  EXPECT_EQ(computeOrder(2), "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7 ");
  // The last rank: no warm-up, three W's left for the end.
  EXPECT_EQ(computeOrder(3), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7 ");
  EXPECT_NE(s.describe(3).find("W m7 c0"), std::string::npos) << s.describe(3);
  EXPECT_EQ(toString(ScheduleKind::ZeroBubbleH1), std::string("ZB-H1"));
  EXPECT_EQ(parseScheduleKind("zb-h1"), ScheduleKind::ZeroBubbleH1);
  EXPECT_STREQ(scheduleName(ScheduleKind::ZeroBubbleH1), "zb-h1");
}

TEST(Schedule, SimulatorDetectsADeadlock) {
  // Both ranks send first, each in its own batch: neither send meets a receive.
  Schedule s;
  s.pp = 2;
  s.ranks.resize(2);
  auto batch = [](CommKind k, int peer) {
    Action a;
    a.kind = Action::Comm;
    a.comm.push_back({k, 0, 0, peer});
    return a;
  };
  s.ranks[0] = {batch(CommKind::SendForward, 1), batch(CommKind::RecvBackward, 1)};
  s.ranks[1] = {batch(CommKind::SendBackward, 0), batch(CommKind::RecvForward, 0)};
  EXPECT_NE(simulate(s).find("deadlock"), std::string::npos);
  // Fused into one batch per rank, the same transfers go through.
  s.ranks[0] = {batch(CommKind::SendForward, 1)};
  s.ranks[0][0].comm.push_back({CommKind::RecvBackward, 0, 0, 1});
  s.ranks[1] = {batch(CommKind::RecvForward, 0)};
  s.ranks[1][0].comm.push_back({CommKind::SendBackward, 0, 0, 0});
  EXPECT_EQ(simulate(s), "");
}

TEST(Schedule, InvalidCombinationsAreClearErrors) {
  auto expectError = [](auto fn, std::vector<std::string> parts) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const tessera::Error& e) {
      for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  };
  expectError([] { makeSchedule(ScheduleKind::OneFOneB, 4, 3); }, {"1F1B", "3 micro-batches", "pp = 4"});
  expectError([] { makeSchedule(ScheduleKind::Interleaved1F1B, 4, 6, 2); }, {"multiple of pp", "6 micro-batches", "pp = 4"});
  expectError([] { makeSchedule(ScheduleKind::Interleaved1F1B, 2, 4, 1); }, {"at least 2 virtual stages"});
  expectError([] { makeSchedule(ScheduleKind::GPipe, 2, 0); }, {"0 micro-batches"});
  expectError([] { makeSchedule(ScheduleKind::OneFOneB, 2, 4, 2); }, {"1F1B takes one chunk"});
  expectError([] { makeSchedule(ScheduleKind::GPipe, 2, 4, 1, 1); }, {"1F1B only", "GPipe"});
  expectError([] { makeSchedule(ScheduleKind::Interleaved1F1B, 2, 4, 2, 1); }, {"1F1B only", "interleaved"});
  expectError([] { makeSchedule(ScheduleKind::OneFOneB, 2, 4, 1, -1); }, {"extra warm-up of -1"});
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleH1, 4, 3); }, {"ZB-H1", "3 micro-batches", "pp = 4"});
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleH1, 2, 4, 2); }, {"ZB-H1 takes one chunk"});
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleH1, 2, 4, 1, 1); }, {"1F1B only", "ZB-H1"});
}
