// Fault test: one rank is SIGKILLed in the middle of an all-reduce; every other rank must
// exit non-zero with a clear error naming the op within the timeout (never hang).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "harness/multiprocess.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(kill_during_allreduce) {
  auto ctx = initWorker(w);
  auto t = at::ones({4 << 20});  // 16 MiB: long enough to be mid-flight when the kill lands
  for (int step = 0; step < 1000; ++step) {
    auto work = ctx.world->allReduce(t, ReduceOp::Avg);
    if (w.rank == w.world - 1 && step == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      raise(SIGKILL);
    }
    work->synchronize();  // survivors: throws CommError → worker exits 1 with the message
  }
  WCHECK(false, "rank {} finished 1000 all-reduces although a peer was killed", w.rank);
}

TEST(Fault, KilledRankMidAllReduceEndsEveryOtherRankWithClearError) {
  const double timeoutS = 10;
  RunOptions o;
  o.ranks = 3;
  o.timeout = std::chrono::seconds(60);
  o.killSiblingsOnFailure = false;
  o.env = {{"TESSERA_TIMEOUT_S", "10"}};
  auto res = runWorkers("kill_during_allreduce", o);
  EXPECT_EQ(res[2].signal, SIGKILL) << res[2].output;
  for (int r = 0; r < 2; ++r) {
    fmt::print("rank {} ended after {:.2f} s, exit {}, output:\n{}\n", r, res[r].seconds, res[r].exitCode,
               res[r].output);
    EXPECT_FALSE(res[r].killedByHarness) << "rank " << r << " hung; output:\n" << res[r].output;
    EXPECT_EQ(res[r].exitCode, 1) << res[r].output;
    EXPECT_LT(res[r].seconds, timeoutS + 10) << res[r].output;
    EXPECT_NE(res[r].output.find("all_reduce #"), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("group 'world'"), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find(fmt::format("rank {} of 3", r)), std::string::npos) << res[r].output;
  }
}
