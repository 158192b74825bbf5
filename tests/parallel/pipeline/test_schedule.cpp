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

#include "schedule_checks.h"
#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/schedule.h"

using namespace tessera::pipeline;
using namespace tessera::pipeline::schedule_checks;


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
