// NCCL communicator on 2 GPUs, fingerprint mode (the default): collectives whose ranks disagree
// (sizes, op, root) fail on both ranks with a catchable CommError naming both calls; the group is
// aborted (its later ops fail with the first error), 'world' and the process go on. The timeout is
// 120 s, the run's limit 60 s: an ending run did not wait for it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "gpu_test_util.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(nccl_mismatch) {
  auto ctx = initWorker(w, Backend::Nccl);
  auto on = at::TensorOptions().device(ctx.device);
  const bool odd = w.rank == 1;
  struct Case {
    const char* group;
    std::function<WorkPtr(Communicator&)> call;
    const char* rank0;
    const char* rank1;
  };
  const std::vector<Case> cases = {
      {"ar", [&](Communicator& c) { return c.allReduce(at::ones({odd ? 8 : 4}, on)); },
       "all_reduce of 4 x float32 (sum)", "all_reduce of 8 x float32 (sum)"},
      {"ag", [&](Communicator& c) { return c.allGather(at::empty({2 * (odd ? 5 : 4)}, on), at::ones({odd ? 5 : 4}, on)); },
       "all_gather of 4 x float32 per rank", "all_gather of 5 x float32 per rank"},
      {"op", [&](Communicator& c) { return odd ? c.broadcast(at::ones({4}, on), 0) : c.allReduce(at::ones({4}, on)); },
       "all_reduce of 4 x float32 (sum)", "broadcast of 4 x float32 from root 0"},
      {"root", [&](Communicator& c) { return c.broadcast(at::ones({1 << 20}, on), odd ? 1 : 0); },
       "broadcast of 1048576 x float32 from root 0", "broadcast of 1048576 x float32 from root 1"},
  };
  for (const auto& k : cases) {
    auto sub = ctx.world->split(0, w.rank, k.group);
    sub->allReduce(at::ones({2}, on))->synchronize();  // matching: #1 passes
    const auto both = fmt::format("rank 0{} called {}; rank 1{} called {}", w.rank == 0 ? " (this rank)" : "", k.rank0,
                                  w.rank == 1 ? " (this rank)" : "", k.rank1);
    std::string m;
    try {
      auto work = k.call(*sub);
      work->wait();  // the caller's stream waits; no host synchronisation, no error yet
      work->synchronize();
    } catch (const CommError& e) {
      m = e.what();
    }
    fmt::print("rank {}, group '{}': {}\n", w.rank, k.group, m);
    for (const auto& part : {fmt::format("#2 on group '{}' (rank {} of 2", k.group, w.rank), both,
                             fmt::format("NCCL communicator '{}' is aborted", k.group)}) {
      WCHECK(m.find(part) != std::string::npos, "message '{}' lacks '{}'", m, part);
    }
    expectErrorContaining([&] { sub->barrier()->synchronize(); }, {"broken", k.rank1});
  }
  auto t = at::ones({1 << 20}, on);
  ctx.world->allReduce(t)->synchronize();
  WCHECK(t.eq(2.0).all().item<bool>(), "world all_reduce after the mismatches gave {}", t[0].item<double>());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the exit grace: no watchdog exit
}

TEST(NcclCollectives, MismatchesFailBothRanksNamingBothCalls) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_mismatch", gpuRun(60, {{"TESSERA_TIMEOUT_S", "120"}, {"TESSERA_EXIT_GRACE_S", "0.5"}})));
}
