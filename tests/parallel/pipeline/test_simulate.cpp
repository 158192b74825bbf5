// pipeline::simulateStep against what can be worked out by hand: a balanced pipeline's makespan
// (M + pp − 1)(F + B) for GPipe and 1F1B; a transfer on every hop of the fill and drain; an
// unbalanced 2-stage 1F1B whose extra warm-up forwards keep the slow stage busy from start to
// end (makespan = M · its F + B), which plain 1F1B does not; ZB-H1 with forward, B and W of one
// unit each: 3M + (pp − 1) against 1F1B's 3M + 3(pp − 1), and between its dependency bound and
// 1F1B when W is cheaper than B; and the errors.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/simulate.h"

using namespace tessera::pipeline;

namespace {
std::vector<StageCost> uniform(int n, double f, double b) { return std::vector<StageCost>(n, StageCost{f, b}); }
}  // namespace

TEST(Simulate, BalancedPipelinesFillAndDrain) {
  for (auto kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int pp = 1; pp <= 4; ++pp)
      for (int M = pp; M <= 8; ++M) {
        auto s = makeSchedule(kind, pp, M);
        auto r = simulateStep(s, uniform(pp, 1, 2));
        EXPECT_DOUBLE_EQ(r.step, (M + pp - 1) * 3.0) << toString(kind) << " pp " << pp << " M " << M;
        for (int q = 0; q < pp; ++q) {
          EXPECT_DOUBLE_EQ(r.busy[q], 3.0 * M);
          EXPECT_DOUBLE_EQ(r.idle[q], (pp - 1) * 3.0);
        }
      }
}

TEST(Simulate, TransfersAddToTheCriticalPath) {
  // 1F1B, pp 2, M 4, F 1, B 2, each batch 0.5: the first forward reaches stage 1 at 1.5, and in
  // steady state every micro-batch crosses the link twice (activation, then gradient).
  auto s = makeSchedule(ScheduleKind::OneFOneB, 2, 4);
  const double none = simulateStep(s, uniform(2, 1, 2)).step, some = simulateStep(s, uniform(2, 1, 2), 0.5).step;
  EXPECT_DOUBLE_EQ(none, 15.0);
  EXPECT_GT(some, none + 0.5 * 2);  // at least the fill's and the drain's hops
  EXPECT_LE(some, none + 0.5 * 2 * 4 + 0.5);
}

TEST(Simulate, ExtraWarmUpKeepsASlowFirstStageBusy) {
  // Stage 0: F 1, B 2 (3 per micro-batch); stage 1: 0.8 and 1.6. Plain 1F1B waits for the
  // first gradient and again at the end; with two extra warm-up forwards stage 0 never waits.
  const int M = 16;
  std::vector<StageCost> c{{1, 2}, {0.8, 1.6}};
  const double plain = simulateStep(makeSchedule(ScheduleKind::OneFOneB, 2, M), c).step;
  const double extra = simulateStep(makeSchedule(ScheduleKind::OneFOneB, 2, M, 1, 2), c).step;
  EXPECT_DOUBLE_EQ(extra, 3.0 * M);
  EXPECT_GT(plain, 3.0 * M + 1);
  // The interleaved tables settle too (and finish no earlier than the busiest rank's work).
  auto il = makeSchedule(ScheduleKind::Interleaved1F1B, 2, 4, 2);
  auto r = simulateStep(il, uniform(4, 0.5, 1));
  EXPECT_GE(r.step, 4 * 2 * 1.5);
}

TEST(Simulate, ZeroBubbleH1LeavesAThirdOfOneFOneBsBubble) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int M = pp; M <= 12; ++M) {
      const std::vector<StageCost> unit(pp, StageCost{1, 1, 1});
      const auto zb = simulateStep(makeSchedule(ScheduleKind::ZeroBubbleH1, pp, M), unit);
      const auto f1b = simulateStep(makeSchedule(ScheduleKind::OneFOneB, pp, M), unit);
      const std::string where = fmt::format("pp {} M {}", pp, M);
      EXPECT_DOUBLE_EQ(zb.step, 3.0 * M + (pp - 1)) << where;
      EXPECT_DOUBLE_EQ(f1b.step, 3.0 * (M + pp - 1)) << where;  // 1F1B pays B + W in one backward
      for (int r = 0; r < pp; ++r) {
        EXPECT_DOUBLE_EQ(zb.busy[r], 3.0 * M) << where;
        EXPECT_DOUBLE_EQ(zb.idle[r], pp - 1.0) << where;
      }
    }
  // W cheaper than B (attention's backward has no weights). The dependencies alone allow
  // 3M + (pp − 1)(F + B − W) = 30 here; the tables' communication, placed on unit ticks and
  // fused into batches that complete together, costs more (32 in this replay), still under
  // 1F1B's 33.
  const int pp = 4, M = 8;
  const std::vector<StageCost> c(pp, StageCost{1, 1.5, 0.5});
  const double zb = simulateStep(makeSchedule(ScheduleKind::ZeroBubbleH1, pp, M), c).step;
  EXPECT_GE(zb, 3.0 * M + (pp - 1) * 2.0);
  EXPECT_LT(zb, simulateStep(makeSchedule(ScheduleKind::OneFOneB, pp, M), c).step);
  EXPECT_DOUBLE_EQ(simulateStep(makeSchedule(ScheduleKind::OneFOneB, pp, M), c).step, 3.0 * (M + pp - 1));
}

TEST(Simulate, Errors) {
  auto s = makeSchedule(ScheduleKind::OneFOneB, 2, 4);
  auto expectError = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError([&] { simulateStep(s, uniform(3, 1, 1)); }, "3 stage costs for 2 stages");
  expectError([&] { simulateStep(s, {{1, 1}, {1, -1}}); }, "negative cost (stage 1");
  Schedule lonely;
  lonely.pp = 2;
  lonely.ranks.resize(2);
  Action send;
  send.kind = Action::Comm;
  send.comm.push_back({CommKind::SendForward, 0, 0, 1});
  lonely.ranks[0].push_back(send);
  expectError([&] { simulateStep(lonely, uniform(2, 1, 1)); }, "has no counterpart");
}
