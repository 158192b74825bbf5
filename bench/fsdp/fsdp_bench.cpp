// tessera's side of the FSDP benchmark: the benchmarks' GPT-735M (common/bench_model.h: src/models'
// GPT, the trainer's) under tessera::FullyShardedDataParallel with the trainer's units (models/lm.h
// train::keepGathered's units of the parts: the embedding, each block, the final LayerNorm, the head), bf16 parameters, fp32
// reduce-scatter, ShardedAdamW (lr 1e-4) on the fp32 shards; batch B=8 per GPU of random tokens,
// 3 warm-ups then the median of STEPS. As the anchor's fsdp mode (FSDP2 fully_shard per block and
// a root, MixedPrecisionPolicy(bf16, fp32)): no autocast, the bf16 parameters set the compute dtype.
//   torchrun --nproc_per_node=2 --no-python tessera_bench_fsdp [--prefetch-mib N]
// --prefetch-mib: FsdpOptions::prefetchBudgetBytes in MiB (default 512: about two bf16 blocks of
// this model and the units around them); 0 turns prefetch off.
// Env (read at the top): B, STEPS, D, L, V, T; TESSERA_FAKE_WORLD (common/fake_world.h).
// Rank 0 prints RESULT {json} (common/timing.h) with the budget and the peak number and bytes
// of unsharded units alive at once (FsdpStats) on rank 0, the memory allocated right before
// the last step's backward and the peak up to then (where the step's memory goes), first_loss
// and last_loss (rank 0's batch).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "bench_model.h"
#include "tessera/common/error.h"
#include "fake_world.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/data_parallel/data_parallel.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"
#include "tessera/train/model_spec.h"
#include "timing.h"

namespace bench = tessera::bench;

int main(int argc, char** argv) try {
  int64_t budgetMib = 512;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    TESSERA_CHECK(a == "--prefetch-mib" && i + 1 < argc, "usage: {} [--prefetch-mib N] (got {})", argv[0], a);
    budgetMib = std::stoll(argv[++i]);
  }
  const auto cfg = bench::modelFromEnv();
  const int64_t batch = bench::envInt("B", 8);
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  const auto fake = bench::fakeWorldFromEnv();
  auto ctx = bench::initWorld(fake);
  const auto& world = ctx.world;
  const auto device = ctx.device;
  bench::useDevice(device);

  const auto tp = bench::selfGroup(device);
  auto model = bench::buildModel(cfg, tp, tessera::models::ChunkRange::whole(cfg));
  model->to(device);
  const auto parts = model->parts();
  auto units = tessera::partUnits(parts, "stage0", tessera::train::keepGathered);
  tessera::FsdpOptions fo;
  fo.paramDtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;  // CPU smoke runs: fp32
  fo.reduceDtype = at::kFloat;
  fo.prefetchBudgetBytes = static_cast<size_t>(budgetMib) << 20;
  tessera::FullyShardedDataParallel fsdp(units.units, world, fo);
  tessera::AdamWOptions ao;
  ao.lr = 1e-4;
  tessera::ShardedAdamW opt(fsdp, ao);

  at::Tensor x, y;
  std::tie(x, y) = bench::randomBatch(cfg, batch, bench::kDataSeed + world->rank(), device);

  double firstLoss = 0, lastLoss = 0, memBeforeBackward = 0, peakForward = 0;
  bool first = true;
  bench::resetPeakMemory(device);
  fsdp.resetStats();
  auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
    at::Tensor h = x;
    for (size_t k = 0; k < parts.size(); ++k) h = fsdp.runUnit(units.unitOf[k], h, parts[k].run);
    auto loss = tessera::models::lmLoss(h, y, tp, cfg.vocab);
    memBeforeBackward = tessera::allocatedMemoryGiB(device);
    peakForward = bench::peakMemoryGiB(device);
    loss.backward();
    opt.step();
    opt.zeroGrad();
    lastLoss = loss.item<double>();
    if (first) firstLoss = lastLoss, first = false;
  }, world->rank());
  const auto& st = fsdp.stats();
  bench::BenchResult r{fmt::format("tessera-fsdp-prefetch{}", budgetMib), "fsdp", world->size(),
                       static_cast<double>(batch * cfg.seqLen * world->size()), times, bench::peakMemoryGiB(device),
                       fmt::format("\"batch\": {}, \"prefetch_budget_MiB\": {}, \"peak_unsharded_units\": {}, "
                                   "\"peak_unsharded_GiB\": {:.2f}, \"first_loss\": {}, \"last_loss\": {}, "
                                   "\"mem_before_backward_GiB\": {:.2f}, \"peak_through_forward_GiB\": {:.2f}",
                                   batch, budgetMib, st.peakUnshardedUnits,
                                   static_cast<double>(st.peakUnshardedBytes) / (1ull << 30),
                                   bench::jsonNumber(firstLoss), bench::jsonNumber(lastLoss), memBeforeBackward,
                                   peakForward)};
  if (world->rank() == 0) std::cout << bench::resultLine(cfg, r, fake) << std::endl;
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "fsdp_bench: error: " << e.what() << std::endl;
  return 1;
}
