// NCCL communicator on 2 GPUs: every collective for every dtype (odd sizes included) against
// hand-computed results (the suite shared with Gloo), also under TESSERA_NCCL_CTA_POLICY=efficiency
// and with a bad policy refused by name, sub-communicators by ncclCommSplit, input errors, and abort().
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/collective_check.h"
#include "comm/collectives_suite.h"
#include "gpu_test_util.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
at::TensorOptions on(const Context& ctx) { return at::TensorOptions().device(ctx.device); }
}  // namespace

TESSERA_WORKER(nccl_suite) {
  auto ctx = initWorker(w, Backend::Nccl);
  WCHECK(ctx.world->backend() == Backend::Nccl, "backend is {}", toString(ctx.world->backend()));
  WCHECK(ctx.device.is_cuda() && ctx.device.index() == w.rank, "rank {} got device {}", w.rank, ctx.device.str());
  WCHECK(ctx.world->size() == w.world && ctx.world->rank() == w.rank, "world is {} of {}", ctx.world->rank(),
         ctx.world->size());
  runCollectiveSuite(*ctx.world, on(ctx));
  // Works issued back to back without waiting, then one synchronize: stream order holds.
  auto t = at::ones({1 << 20}, on(ctx).dtype(at::kFloat));
  for (int k = 0; k < 10; ++k) ctx.world->allReduce(t, ReduceOp::Sum);
  ctx.world->barrier()->synchronize();
  double got = t[12345].item<double>();
  WCHECK(got == 1024.0, "10 chained sum all-reduces of ones over 2 ranks gave {}, want 2^10", got);
}

TEST(NcclCollectives, EveryOpEveryDtypeMatchesHandComputed) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_suite", gpuRun(300)));
}

// The same suite with NCCL told to use as few CTAs as it can (ncclConfig_t::CTAPolicy).
TEST(NcclCollectives, EveryOpUnderTheEfficiencyCtaPolicy) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_suite", gpuRun(300, {{"TESSERA_NCCL_CTA_POLICY", "efficiency"}})));
}

TESSERA_WORKER(nccl_bad_cta_policy) {
  expectErrorContaining([&] { initWorker(w, Backend::Nccl); },
                        {"TESSERA_NCCL_CTA_POLICY value 'fastest'", "allowed: default, efficiency, zero"});
}

TEST(NcclCollectives, BadCtaPolicyIsNamed) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_bad_cta_policy", gpuRun(60, {{"TESSERA_NCCL_CTA_POLICY", "fastest"}})));
}

TESSERA_WORKER(nccl_split) {
  auto ctx = initWorker(w, Backend::Nccl);
  auto& world = *ctx.world;
  // Reversed order: key = -rank makes world rank 1 the new rank 0.
  auto rev = world.split(0, -w.rank, "reversed");
  WCHECK(rev && rev->size() == 2 && rev->rank() == 1 - w.rank, "reversed: rank {} of {}", rev ? rev->rank() : -1,
         rev ? rev->size() : -1);
  WCHECK(rev->name() == "reversed", "name '{}'", rev->name());
  auto x = at::full({5}, rev->rank() + 1, on(ctx).dtype(at::kLong));
  auto all = at::empty({10}, on(ctx).dtype(at::kLong));
  rev->allGather(all, x)->synchronize();
  auto cpu = all.cpu();
  WCHECK(cpu[0].item<int64_t>() == 1 && cpu[9].item<int64_t>() == 2, "gather in new-rank order: {}", str(cpu));
  // One group per rank (size 1): collectives are local copies.
  auto solo = world.split(w.rank, 0, fmt::format("solo{}", w.rank));
  WCHECK(solo && solo->size() == 1 && solo->rank() == 0, "solo: rank {} of {}", solo->rank(), solo->size());
  auto y = at::full({3}, 7.0, on(ctx));
  solo->allReduce(y)->synchronize();
  WCHECK(y.sum().item<double>() == 21.0, "solo all-reduce changed the data: {}", str(y.cpu()));
  // The parent still works after its splits.
  auto z = at::ones({4}, on(ctx));
  world.allReduce(z)->synchronize();
  WCHECK(z.sum().item<double>() == 8.0, "world all-reduce after split: {}", str(z.cpu()));
}

TEST(NcclCollectives, SplitMakesSubCommunicators) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_split", gpuRun(120)));
}

TESSERA_WORKER(nccl_bad_inputs) {
  auto ctx = initWorker(w, Backend::Nccl);
  auto& c = *ctx.world;
  auto dev = ctx.device.str();
  expectErrorContaining([&] { c.allReduce(at::ones({4})); }, {"all_reduce", "is on cpu", "takes tensors on " , "rank"});
  expectErrorContaining([&] { c.allGather(at::empty({8}, on(ctx)), at::ones({4})); }, {"all_gather", "input tensor is on cpu"});
  expectErrorContaining([&] { c.broadcast(at::ones({4}, on(ctx).dtype(at::kDouble)), 0); }, {"broadcast", "float64"});
  expectErrorContaining([&] { c.allReduce(at::ones({4, 4}, on(ctx)).t()); }, {"all_reduce", "not contiguous"});
  expectErrorContaining([&] { c.reduceScatter(at::empty({3}, on(ctx)), at::ones({7}, on(ctx))); },
                  {"reduce_scatter", "divisible"});
  expectErrorContaining([&] { c.send(at::ones({4}), 1 - w.rank); }, {"send", "is on cpu"});
  auto other = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(1 - ctx.device.index()));
  expectErrorContaining([&] { c.allReduce(at::ones({4}, at::TensorOptions().device(other))); },
                  {"all_reduce", "is on cuda:", "takes tensors on cuda:"});
  auto t = at::ones({16}, on(ctx));
  expectErrorContaining([&] { c.allToAll(t, t); }, {"all_to_all", "not in place"});
  // None of the bad calls reached NCCL: the communicator still works.
  c.allReduce(t)->synchronize();
  WCHECK(t.sum().item<double>() == 32.0, "all-reduce after rejected inputs: {}", str(t.cpu()));
  // abort(): later ops fail with the reason, locally and at once.
  c.barrier()->synchronize();
  c.abort("test asked for it");
  expectErrorContaining([&] { c.allReduce(t)->synchronize(); }, {"all_reduce", "broken", "test asked for it"});
}

TEST(NcclCollectives, BadInputsNameOpRankAndValue) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("nccl_bad_inputs", gpuRun(120)));
}
