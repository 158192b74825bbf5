// ZB-V (schedule.h): two chunks per rank in a V, backward split into B and W. Its tables pass the
// checks every schedule passes (schedule_checks.h) for pp 2..4 and pp..12 micro-batches and keep at
// most 2·pp chunk activations alive on a rank; the stages lie in a V (rank 0 holds the first and the
// last, rank pp − 1 hands over between its chunks without communication); and with unit costs it
// fills more than half of 1F1B's bubble (issue 53's bar), as ZB-H1 does, on the simulated timeline.
#include <gtest/gtest.h>

#include "schedule_checks.h"
#include "tessera/parallel/pipeline/simulate.h"

using namespace tessera::pipeline;
using namespace tessera::pipeline::schedule_checks;

TEST(ScheduleZbv, TablesAreValidDeadlockFreeAndBounded) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int M = pp; M <= 12; ++M) checkAll(ScheduleKind::ZeroBubbleV, pp, M, 2);
}

TEST(ScheduleZbv, StagesLieInAV) {
  const int P = 4;
  auto s = makeSchedule(ScheduleKind::ZeroBubbleV, P, 8, 2);
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(s.stageOf(r, 0), r);
    EXPECT_EQ(s.stageOf(r, 1), 2 * P - 1 - r);
    EXPECT_EQ(s.rankOfStage(s.stageOf(r, 1)), r);
    EXPECT_EQ(s.chunkOfStage(s.stageOf(r, 1)), 1);
  }
  EXPECT_EQ(s.lastStageRank(), 0);
  EXPECT_TRUE(s.isLastStage(0, 1));
  EXPECT_EQ(s.localNextChunk(P - 1, 0), 1);
  EXPECT_EQ(s.localPrevChunk(P - 1, 1), 0);
  EXPECT_EQ(s.localPrevChunk(P - 2, 1), -1);
  EXPECT_EQ(s.localNextChunk(0, 1), -1);
  for (const auto& a : s.ranks[P - 1]) {
    for (const auto& c : a.comm) EXPECT_NE(c.peer, P - 1) << toString(c.kind) << " m" << c.micro;
  }
  // Interleaved placement is unchanged: chunk c of rank r is stage c·pp + r.
  auto il = makeSchedule(ScheduleKind::Interleaved1F1B, P, 8, 2);
  EXPECT_EQ(il.stageOf(1, 1), P + 1);
  EXPECT_EQ(il.lastStageRank(), P - 1);
  EXPECT_EQ(il.localPrevChunk(0, 1), -1);
}

TEST(ScheduleZbv, FillsMoreThanHalfOfOneFOneBsBubble) {
  // The same model either way: a 1F1B stage does F 2, B 2, W 2 per micro-batch; a ZB-V chunk is half a stage.
  for (int pp = 2; pp <= 4; ++pp)
    for (int M : {2 * pp, 4 * pp}) {
      const double oneF = simulateStep(makeSchedule(ScheduleKind::OneFOneB, pp, M),
                                       std::vector<StageCost>(pp, StageCost{2, 2, 2}))
                              .step;
      const double ideal = 6.0 * M, bubble = oneF - ideal;
      EXPECT_DOUBLE_EQ(bubble, 6.0 * (pp - 1)) << "pp " << pp << " M " << M;
      const double zbv = simulateStep(makeSchedule(ScheduleKind::ZeroBubbleV, pp, M, 2),
                                      std::vector<StageCost>(2 * pp, StageCost{1, 1, 1}))
                             .step;
      EXPECT_GE(zbv, ideal) << "pp " << pp << " M " << M;
      EXPECT_LE(zbv, oneF - bubble / 2) << "pp " << pp << " M " << M << ": ZB-V " << zbv << ", 1F1B " << oneF;
      const double h1 = simulateStep(makeSchedule(ScheduleKind::ZeroBubbleH1, pp, M),
                                     std::vector<StageCost>(pp, StageCost{2, 2, 2}))
                            .step;
      EXPECT_LE(h1, oneF - bubble / 2) << "pp " << pp << " M " << M;
    }
}

TEST(ScheduleZbv, NamesAndInvalidCombinations) {
  EXPECT_EQ(parseScheduleKind("zbv"), ScheduleKind::ZeroBubbleV);
  EXPECT_STREQ(toString(ScheduleKind::ZeroBubbleV), "ZB-V");
  EXPECT_STREQ(scheduleName(ScheduleKind::ZeroBubbleV), "zbv");
  EXPECT_TRUE(makeSchedule(ScheduleKind::ZeroBubbleV, 2, 4, 2).splitsBackward());
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleV, 4, 8, 1); },
                                          {"ZB-V runs two chunks per rank", "got 1"});
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleV, 1, 4, 2); }, {"ZB-V needs pp >= 2"});
  expectError([] { makeSchedule(ScheduleKind::ZeroBubbleV, 4, 3, 2); },
                                          {"ZB-V", "3 micro-batches", "pp = 4"});
}
