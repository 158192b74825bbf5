// The settings src/common and the TP layers read from the environment: a malformed value is a
// tessera::Error naming the variable and the value. Each value is read once per process, so
// each case runs in its own worker process with the variable set.
#include <gtest/gtest.h>

#include "common/profiler.h"
#include "common/sm_carveout.h"
#include "harness/multiprocess.h"
#include "parallel/tensor/linear_overlap.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(bad_overlap_settings) {
  expectErrorContaining([] { defaultSmCarveout(); }, {"TESSERA_OVERLAP_SM_CARVEOUT=-3", "not a number of SMs"});
  expectErrorContaining([] { tp::defaultForwardChunks(); }, {"TESSERA_TP_FORWARD_CHUNKS=0", "not a number of pieces"});
  expectErrorContaining([] { tp::defaultRing(); }, {"TESSERA_TP_RING=2", "not 0 or 1"});
}
TEST(Settings, MalformedOverlapSettingsAreNamed) {
  expectAllOk(runWorkers("bad_overlap_settings",
                         {.ranks = 1,
                          .env = {{"TESSERA_OVERLAP_SM_CARVEOUT", "-3"}, {"TESSERA_TP_FORWARD_CHUNKS", "0"}, {"TESSERA_TP_RING", "2"}}}));
}

TESSERA_WORKER(good_overlap_settings) {
  WCHECK(defaultSmCarveout() == 16, "TESSERA_OVERLAP_SM_CARVEOUT=16 read as {}", defaultSmCarveout());
  WCHECK(tp::defaultForwardChunks() == 3, "TESSERA_TP_FORWARD_CHUNKS=3 read as {}", tp::defaultForwardChunks());
  tp::LinearOverlap o;  // the defaults of every TP layer
  WCHECK(o.smCarveout == 16 && o.forwardChunks == 3 && o.ring, "LinearOverlap defaults {} / {} / ring {}", o.smCarveout,
         o.forwardChunks, o.ring);
}
TEST(Settings, OverlapSettingsBecomeTheDefaults) {
  expectAllOk(runWorkers("good_overlap_settings",
                         {.ranks = 1,
                          .env = {{"TESSERA_OVERLAP_SM_CARVEOUT", "16"}, {"TESSERA_TP_FORWARD_CHUNKS", "3"}, {"TESSERA_TP_RING", "1"}}}));
}

TEST(Settings, MalformedProfileSpecIsNamed) {
  expectErrorContaining([] { StepProfiler p(0, "trace.json:x"); }, {"TESSERA_PROFILE='trace.json:x'", "PATH[:FIRST[:COUNT]]"});
  expectErrorContaining([] { StepProfiler p(0, "trace.json:3:0"); }, {"TESSERA_PROFILE='trace.json:3:0'", "COUNT > 0"});
  expectErrorContaining([] { StepProfiler p(0, ":3"); }, {"TESSERA_PROFILE=':3'"});
  EXPECT_FALSE(StepProfiler(0, "").enabled());
}
