// tessera's side of the FSDP benchmark: the anchors' GPT-735M (common/gpt.h) under
// tessera::FullyShardedDataParallel, one unit per block plus a root unit (embedding, final
// LayerNorm, head; kept gathered between forward and backward), bf16 parameters, fp32
// reduce-scatter, ShardedAdamW (lr 1e-4) on the fp32 shards; batch B=8 per GPU of random
// tokens, 3 warm-ups then the median of STEPS. As the anchor's fsdp mode (FSDP2 fully_shard per
// block, MixedPrecisionPolicy(bf16, fp32)): no autocast, the bf16 parameters set the compute dtype.
//   torchrun --nproc_per_node=2 --no-python tessera_bench_fsdp [--prefetch-mib N]
// --prefetch-mib: FsdpOptions::prefetchBudgetBytes in MiB (default 512: the root unit and
// about two bf16 blocks of this model); 0 turns prefetch off.
// Rank 0 prints RESULT {json} (common/timing.h) with the budget and the peak number and bytes
// of unsharded units alive at once (FsdpStats) on rank 0, and the memory allocated right before
// the last step's backward and the peak up to then (where the step's memory goes).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/error.h"
#include "gpt.h"
#include "sharding/fsdp/fsdp.h"
#include "sharding/fsdp/optimizer.h"
#include "fake_world.h"
#include "timing.h"

namespace bench = tessera::bench;

namespace {

std::vector<std::pair<std::string, at::Tensor>> named(const std::string& prefix, torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& p : m.named_parameters(true)) out.emplace_back(prefix + p.key(), p.value());
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t budgetMib = 512;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    TESSERA_CHECK(a == "--prefetch-mib" && i + 1 < argc, "usage: {} [--prefetch-mib N] (got {})", argv[0], a);
    budgetMib = std::stoll(argv[++i]);
  }
  const bench::GptConfig cfg = bench::gptConfigFromEnv();
  const int64_t batch = bench::envInt("B", 8);
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  auto ctx = bench::initWorld();
  const auto& world = ctx.world;
  const auto device = ctx.device;
  bench::useDevice(device);

  torch::manual_seed(0);
  bench::BenchGpt model(cfg);
  model->to(device);
  std::vector<tessera::FsdpUnitSpec> units;
  tessera::FsdpUnitSpec root{"root", named("emb.", *model->emb), /*reshardAfterForward=*/false, {}};
  for (auto& p : named("lnf.", *model->lnf)) root.params.push_back(p);
  for (auto& p : named("head.", *model->head)) root.params.push_back(p);
  units.push_back(root);
  for (size_t i = 0; i < model->blocks->size(); ++i)
    units.push_back({fmt::format("blocks.{}", i), named(fmt::format("blocks.{}.", i), *model->blocks[i]), {}, {}});
  tessera::FsdpOptions fo;
  fo.paramDtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;  // CPU smoke runs: fp32
  fo.reduceDtype = at::kFloat;
  fo.prefetchBudgetBytes = static_cast<size_t>(budgetMib) << 20;
  tessera::FullyShardedDataParallel fsdp(units, world, fo);
  tessera::AdamWOptions ao;
  ao.lr = 1e-4;
  tessera::ShardedAdamW opt(fsdp, ao);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + world->rank());
  auto x = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);
  auto y = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);

  double lastLoss = 0, memBeforeBackward = 0, peakForward = 0;
  bench::resetPeakMemory(device);
  fsdp.resetStats();
  auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
    auto h = fsdp.runUnit(0, x, [&](const at::Tensor& t) { return model->emb->forward(t); });
    for (size_t i = 0; i < model->blocks->size(); ++i)
      h = fsdp.runUnit(1 + i, h, [&](const at::Tensor& v) { return model->blocks[i]->as<bench::BenchBlock>()->forward(v); });
    auto logits = fsdp.runUnit(0, h, [&](const at::Tensor& v) { return bench::linear(model->head, model->lnf->forward(v)); });
    auto loss = bench::gptLoss(logits, y);
    memBeforeBackward = tessera::allocatedMemoryGiB(device);
    peakForward = bench::peakMemoryGiB(device);
    loss.backward();
    opt.step();
    opt.zeroGrad();
    lastLoss = loss.item<double>();
  });
  const auto& st = fsdp.stats();
  bench::BenchResult r{fmt::format("tessera-fsdp-prefetch{}", budgetMib), "fsdp", world->size(),
                       static_cast<double>(batch * cfg.seqLen * world->size()), times, bench::peakMemoryGiB(device),
                       fmt::format("\"batch\": {}, \"prefetch_budget_MiB\": {}, \"peak_unsharded_units\": {}, "
                                   "\"peak_unsharded_GiB\": {:.2f}, \"last_loss\": {}, \"mem_before_backward_GiB\": {:.2f}, "
                                   "\"peak_through_forward_GiB\": {:.2f}",
                                   batch, budgetMib, st.peakUnshardedUnits,
                                   static_cast<double>(st.peakUnshardedBytes) / (1ull << 30), bench::jsonNumber(lastLoss),
                                   memBeforeBackward, peakForward)};
  if (world->rank() == 0) std::cout << bench::resultLine(cfg, r) << std::endl;
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "fsdp_bench: error: " << e.what() << std::endl;
  return 1;
}
