// NCCL communicator on 2 GPUs: ordering with the caller's current stream (a collective issued
// behind a slow kernel sees that kernel's write; wait() never blocks the host), and a peer
// SIGKILLed in the middle of a sequence of all-reduces (the survivor raises a clear CommError
// within the timeout: the watchdog's ncclCommAbort makes it raise rather than hang).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>

#include "comm/nccl/cuda_stream.h"
#include "gpu_test_util.h"
#include "spin_kernel.h"

using namespace tessera;
using namespace tessera::testing;
using Clock = std::chrono::steady_clock;

namespace {
double msSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

TESSERA_WORKER(nccl_stream_order) {
  auto ctx = initWorker(w, Backend::Nccl);
  auto& c = *ctx.world;
  auto opts = at::TensorOptions().device(ctx.device).dtype(at::kFloat);
  auto t = at::zeros({1 << 22}, opts);
  c.allReduce(t)->synchronize();  // connect first: the first op may block the host while NCCL connects
  void* stream = tessera::cuda::currentStream(ctx.device.index());
  // Rank 0's kernel is much slower, so rank 1's all-reduce also has to wait for rank 0's write.
  const double spinMs = w.rank == 0 ? 1500 : 300;
  // Warm up the torch kernels timed below: the first launch of a kernel loads its module
  // (CUDA lazy loading), which waits for running kernels and would be misread as a host sync
  // (seen on nvidia-h200-x2: add_/mul_ took the spin kernel's full time on first use).
  t.add_(0);
  t.mul_(2);
  launchSpinThenFill(t.data_ptr<float>(), t.numel(), 0.0f, 1, stream);
  c.barrier()->synchronize();
  // Control: the kernel launch and a torch op behind it alone must not block the host.
  auto c0 = Clock::now();
  launchSpinThenFill(t.data_ptr<float>(), t.numel(), 0.0f, 200, stream);
  t.add_(0);
  double controlMs = msSince(c0);
  c.barrier()->synchronize();  // host-blocks until the control kernel is done on both ranks
  auto t0 = Clock::now();
  launchSpinThenFill(t.data_ptr<float>(), t.numel(), static_cast<float>(w.rank + 1), spinMs, stream);
  double launchMs = msSince(t0);
  auto work = c.allReduce(t, ReduceOp::Sum);
  double issueMs = msSince(t0);
  work->wait();
  double waitMs = msSince(t0);
  t.mul_(2);  // on the caller's stream, after wait(): must see the all-reduce's result
  double hostMs = msSince(t0);
  auto cpu = t.cpu();  // synchronises the caller's stream
  double totalMs = msSince(t0);
  fmt::print("rank {}: host ms (cumulative): spin launch {:.2f}, all_reduce issued {:.2f}, wait() {:.2f}, mul_ "
             "{:.2f}; result read after {:.0f} ms (kernel {:.0f} ms; control launch+add_ {:.2f} ms; "
             "TESSERA_NCCL_BLOCKING={})\n", w.rank, launchMs, issueMs, waitMs, hostMs, totalMs, spinMs, controlMs,
             std::getenv("TESSERA_NCCL_BLOCKING") ? std::getenv("TESSERA_NCCL_BLOCKING") : "unset");
  std::fflush(stdout);
  WCHECK(totalMs >= 1400, "the result was ready after {:.0f} ms, before rank 0's 1500 ms kernel ended", totalMs);
  auto mn = cpu.min().item<double>(), mx = cpu.max().item<double>();
  WCHECK(mn == 6.0 && mx == 6.0, "(1 + 2) * 2 expected everywhere, got min {} max {}: the all-reduce did not wait "
         "for the kernel on the caller's stream, or mul_ did not wait for the all-reduce", mn, mx);
  WCHECK(controlMs < 100, "control: launching the spin kernel and add_ took {:.0f} ms of host time (no tessera "
         "call involved): the machine's CUDA launches block, so the check below would mean nothing", controlMs);
  WCHECK(hostMs < spinMs / 2, "issuing the all-reduce and wait() took {:.0f} ms of host time behind a {:.0f} ms "
         "kernel: they must not synchronise the host", hostMs, spinMs);
  WCHECK(work->completed(), "work not completed after its result was read");
  // Tensors dropped right after issuing stay alive until the op completes (no use-after-free).
  for (int k = 0; k < 20; ++k) {
    auto tmp = at::full({1 << 20}, 1.0, opts);
    c.allReduce(tmp);
  }
  auto last = at::full({1 << 20}, 5.0, opts);
  c.allReduce(last)->synchronize();
  WCHECK(last.min().item<double>() == 10.0, "after 20 fire-and-forget all-reduces: {}", last.min().item<double>());
}

TEST(NcclStreams, CollectiveBehindSlowKernelSeesItsWrite) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_stream_order", gpuRun(120)));
}

TESSERA_WORKER(nccl_kill_mid_allreduce) {
  auto ctx = initWorker(w, Backend::Nccl);
  auto t = at::ones({16 << 20}, at::TensorOptions().device(ctx.device));  // 64 MiB per op
  for (int step = 0; step < 100000; ++step) {
    auto work = ctx.world->allReduce(t, ReduceOp::Avg);
    if (w.rank == 1 && step == 20) raise(SIGKILL);
    work->synchronize();  // the survivor: throws CommError → worker exits 1 with the message
  }
  WCHECK(false, "rank {} finished 100000 all-reduces although its peer was killed", w.rank);
}

TEST(NcclFault, KilledPeerMidAllReduceEndsSurvivorWithClearError) {
  TESSERA_REQUIRE_GPUS(2);
  const double timeoutS = 10;
  auto o = gpuRun(120, {{"TESSERA_TIMEOUT_S", "10"}});
  o.killSiblingsOnFailure = false;
  auto res = runWorkers("nccl_kill_mid_allreduce", o);
  EXPECT_EQ(res[1].signal, SIGKILL) << res[1].output;
  const auto& r0 = res[0];
  fmt::print("survivor ended after {:.2f} s (timeout {} s), exit {}, output:\n{}\n", r0.seconds, timeoutS,
             r0.exitCode, r0.output);
  EXPECT_FALSE(r0.killedByHarness) << "rank 0 hung; output:\n" << r0.output;
  EXPECT_EQ(r0.exitCode, 1) << r0.output;
  // Init + 20 all-reduces take a few seconds; the failure must come within the timeout after.
  EXPECT_LT(r0.seconds, timeoutS + 20) << r0.output;
  EXPECT_NE(r0.output.find("all_reduce #"), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("group 'world'"), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("rank 0 of 2"), std::string::npos) << r0.output;
  bool timedOut = r0.output.find("timed out after") != std::string::npos;
  bool asyncErr = r0.output.find("asynchronous error") != std::string::npos;
  EXPECT_TRUE(timedOut || asyncErr) << r0.output;
}
