// FSDP's own keeping of its collectives' tensors (Keep::ByCaller, fsdp.h) on one GPU, over the
// timed fake communicator (src/comm/fake/fake_timing.h) as rank 0 of 2: every all-gather and
// reduce-scatter then runs on a stream of its own for 2 ms of modelled time and writes its
// output only at the end, while the host and the compute stream run ahead. Buffers FSDP frees
// too early (before the compute stream waited for the op) get reused by later allocations and
// overwritten before the op reads or writes them, so the trained shards would differ from
// those of the same run over the untimed fake (every op complete when issued). Both must agree
// bitwise after 3 AdamW steps of a tiny GPT (4 blocks of equal size, so the allocator does
// reuse blocks between units), fp32 and bf16 parameters, with and without gradient
// accumulation (a pipeline's order too), and with gatherAfterStep (the next forward's units
// gathered while the optimizer updates the rest) against the untimed run without it. Also:
// clipGradNorm returns without waiting for the device. Skips visibly without a GPU and a CUDA
// LibTorch.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "comm/fake/fake_communicator.h"
#include "comm/gpu/gpu_test_util.h"
#include "parallel/data_parallel/fsdp/fsdp_task.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::vector<at::Tensor> train(bool timed, bool bf16, int accum, bool pipelined, bool gatherAfterStep) {
  const at::Device dev(at::kCUDA, 0);
  FakeTiming t;
  t.enabled = timed;
  t.latencyUs = 2000;
  auto world = makeFakeCommunicator(0, 2, dev, "world", t);
  Setup s;
  s.layers = 4;
  auto task = makeTask(s, 100, dev);
  FsdpOptions o;
  if (bf16) o.paramDtype = at::kBFloat16;
  o.prefetchBudgetBytes = 1 << 20;
  o.gatherAfterStep = gatherAfterStep;
  FullyShardedDataParallel fsdp(task.units, world, o);
  ShardedAdamW opt(fsdp, {.lr = kLr});
  for (int step = 0; step < 3; ++step) fsdpStep(fsdp, opt, task, step, accum, /*rank=*/0, /*clip=*/0, pipelined);
  std::vector<at::Tensor> shards;
  for (size_t u = 0; u < fsdp.numUnits(); ++u) shards.push_back(fsdp.masterShard(u).cpu());
  return shards;
}

struct Case {
  bool bf16;
  int accum;
  bool pipelined;
  bool gatherAfterStep = false;  // the timed run's: the next forward's units gathered beside the optimizer
};

class FsdpTimedFake : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpTimedFake, SameShardsAsTheUntimedRun) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const auto c = GetParam();
  const auto untimed = train(false, c.bf16, c.accum, c.pipelined, false);
  const auto timed = train(true, c.bf16, c.accum, c.pipelined, c.gatherAfterStep);
  ASSERT_EQ(timed.size(), untimed.size());
  for (size_t u = 0; u < timed.size(); ++u) {
    EXPECT_TRUE(at::equal(timed[u], untimed[u])) << "unit " << u << ": max difference "
                                                 << (timed[u] - untimed[u]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, FsdpTimedFake,
                         ::testing::Values(Case{false, 1, false}, Case{true, 1, false}, Case{false, 3, false},
                                           Case{true, 3, true}, Case{true, 1, false, true},
                                           Case{false, 3, false, true}));

// clipGradNorm queues its work on the current stream without blocking the host: over the timed
// fake communicator with 200 ms per op, the norm's all-reduce keeps the GPU busy for 200 ms after
// clipGradNorm issues it. A host synchronisation inside (as it had: synchronize() + item())
// would return only once the stream had passed it; so when the call returns, an event recorded on
// the current stream must still be pending (no host clock involved: the call queues a dozen small
// kernels, far less than 200 ms). A first call, waited for, loads those kernels (lazy module loading
// could otherwise stall the checked call). The value, read afterwards, is the norm of this rank's
// gradient shards (the fake all-reduce leaves its input as it is): rtol 1e-5, fp32 sums in
// another order.
TEST(FsdpClipGradNorm, DoesNotBlockTheHost) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  FakeTiming t;
  t.enabled = true;
  t.latencyUs = 200000;
  auto world = makeFakeCommunicator(0, 2, dev, "world", t);
  auto task = makeTask(tessera::testing::Setup{}, 100, dev);  // (Setup alone is gtest's)
  FullyShardedDataParallel fsdp(task.units, world, {});
  fsdpLoss(fsdp, task, 0, 0, /*rank=*/0).backward();
  const double first = fsdp.clipGradNorm(1e9).item<double>();  // waits for backward and the norm
  double sq = 0;
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const int64_t n = fsdp.layout(u).trainableInShard(fsdp.shardRank());
    sq += fsdp.gradShard(u).narrow(0, 0, n).cpu().to(at::kDouble).pow(2).sum().item<double>();
  }
  auto norm = fsdp.clipGradNorm(1e9);
  c10::Event queued(c10::DeviceType::CUDA);
  queued.record(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(dev));
  EXPECT_FALSE(queued.query()) << "clipGradNorm returned only after the stream had passed its 200 ms all-reduce: it "
                                  "blocked the host";
  EXPECT_TRUE(norm.is_cuda() && norm.dim() == 0);
  EXPECT_NEAR(norm.item<double>(), std::sqrt(sq), 1e-5 * std::sqrt(sq));
  EXPECT_EQ(norm.item<double>(), first);  // x 1 left the shards as they were
}

}  // namespace
