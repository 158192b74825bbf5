// Fault tests: one rank is SIGKILLed in the middle of an all-reduce or an all-gather, or hangs
// (sleeps) inside a step; every other rank must exit non-zero with a clear error naming the op
// and the rank that never reported, within the timeout + 10 s (never hang).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "common/host.h"
#include "harness/multiprocess.h"
#include "tessera/parallel/pipeline/p2p.h"

using namespace tessera;
using namespace tessera::testing;

// arg: "all_reduce" | "all_gather" | "pipeline_send" (the last rank is killed at step 3) or "hang" (it sleeps
// 15 s at step 3, past the others' timeout, then goes on and meets the broken group).
TESSERA_WORKER(fault_in_collective) {
  auto ctx = initWorker(w);
  auto t = at::ones({4 << 20});  // 16 MiB: long enough to be mid-flight when the kill lands
  auto gathered = at::empty({w.world * t.numel()});
  const bool victim = w.rank == w.world - 1;
  for (int step = 0; step < 1000; ++step) {
    if (victim && step == 3 && w.arg == "hang") std::this_thread::sleep_for(std::chrono::seconds(15));
    if (w.arg == "pipeline_send") {  // a pipeline of world ranks: activations to the next stage, in a ring
      pipeline::StageP2P p2p(ctx.world, at::kCPU);
      auto meta = pipeline::TensorMeta::of(t);
      if (victim && step == 3) {
        std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          raise(SIGKILL);
        }).detach();
      }
      p2p.exchange({{pipeline::CommKind::SendForward, meta, t, "activation"},
                    {pipeline::CommKind::RecvForward, meta, {}, "activation"}});
      continue;
    }
    auto work = w.arg == "all_gather" ? ctx.world->allGather(gathered, t) : ctx.world->allReduce(t, ReduceOp::Avg);
    if (victim && step == 3 && w.arg != "hang") {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      raise(SIGKILL);
    }
    work->synchronize();  // survivors: throws CommError → worker exits 1 with the message
  }
  WCHECK(false, "rank {} finished 1000 ops although a peer was lost", w.rank);
}

class Fault : public ::testing::TestWithParam<const char*> {};

TEST_P(Fault, EveryOtherRankEndsWithAClearErrorWithinTheTimeout) {
  const std::string kind = GetParam();
  const double timeoutS = 10;
  RunOptions o;
  o.ranks = 3;
  o.timeout = std::chrono::seconds(90);
  o.killSiblingsOnFailure = false;
  o.env = {{"TESSERA_TIMEOUT_S", "10"}};
  o.arg = kind;
  auto res = runWorkers("fault_in_collective", o);
  if (kind == "hang") {
    EXPECT_FALSE(res[2].killedByHarness) << res[2].output;
    EXPECT_NE(res[2].exitCode, 0) << res[2].output;
  } else {
    EXPECT_EQ(res[2].signal, SIGKILL) << res[2].output;
  }
  const std::string op = kind == "all_gather" ? "all_gather #" : kind == "pipeline_send" ? "batch_p2p" : "all_reduce #";
  for (int r = 0; r < 2; ++r) {
    fmt::print("{}: rank {} ended after {:.2f} s, exit {}, output:\n{}\n", kind, r, res[r].seconds, res[r].exitCode,
               res[r].output);
    EXPECT_FALSE(res[r].killedByHarness) << "rank " << r << " hung; output:\n" << res[r].output;
    EXPECT_EQ(res[r].exitCode, 1) << res[r].output;
    EXPECT_LT(res[r].seconds, timeoutS + 10) << res[r].output;
    EXPECT_NE(res[r].output.find(op), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("group 'world'"), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find(fmt::format("rank {} of 3", r)), std::string::npos) << res[r].output;
    EXPECT_NE(res[r].output.find("flight recorder"), std::string::npos) << res[r].output;
    // The error board (comm/watchdog/board.h) names the rank that never reported, and what this
    // host sees of it: gone when killed, alive when it hangs.
    EXPECT_NE(res[r].output.find(fmt::format("cause: no rank published an error; rank 2 (host {}, pid ", hostName())),
              std::string::npos)
        << res[r].output;
    const auto& out = res[r].output;
    if (kind == "hang") {
      EXPECT_NE(out.find("its process is alive but did not report"), std::string::npos) << out;
    } else {  // gone, or a zombie the harness has not reaped yet
      EXPECT_TRUE(out.find("its process is gone") != std::string::npos ||
                  out.find("its process has exited") != std::string::npos)
          << out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, Fault, ::testing::Values("all_reduce", "all_gather", "pipeline_send", "hang"));
