// tessera's side of the tensor-parallel benchmark: the anchors' GPT-735M (common/gpt.h) with
// every rank in one tensor-parallel group (tp = world), trained as the anchor trains it (bf16
// autocast forward, fp32 parameters, fused AdamW lr 1e-4, random tokens; batch B=16 shared by
// all ranks, i.e. every rank sees the same B sequences; 3 warm-ups then the median of STEPS).
//   torchrun --nproc_per_node=2 --no-python tessera_bench_tp [--sp] [--no-overlap]
// The model is tessera's Megatron layout: vocab-parallel embedding, tp::ParallelBlock (qkv and
// fc1 column-parallel, proj and fc2 row-parallel, heads split; activations [T, B, d]), final
// LayerNorm, column-parallel head without bias, and the vocab-parallel cross-entropy (the full
// logits are never gathered). PyTorch's DTensor run (torch_anchor.py tp) shards only
// qkv/proj/fc1/fc2 and replicates embedding, head and loss on both GPUs.
// --sp: sequence parallel (LayerNorms and residuals on T/tp tokens, all-gather/reduce-scatter
// in place of the all-reduces). --no-overlap: the column layers' input-gradient collective runs
// after the weight-gradient GEMM instead of beside it.
// --variants LIST (comma-separated): run these overlap settings one after the other on the same
// model (a fresh optimizer each): "base" (one GEMM then one collective, no carveout), or
// '+'-joined "chunks<N>" (forward in N pieces), "carve<N>" (N SMs kept free of GEMMs that
// run beside a collective) and "ring" (the row layers' forward reduced by a ring of
// point-to-point transfers, row_linear.h); each prints its own RESULT line named tessera-tp[-sp]-<variant>.
// Without it, one run with the layers' defaults (TESSERA_TP_FORWARD_CHUNKS, ..._SM_CARVEOUT,
// TESSERA_TP_RING).
// Rank 0 prints RESULT {json} (common/timing.h) with tp, sequence_parallel, overlap.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>

#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "gpt.h"
#include "parallel/tensor/blocks.h"
#include "parallel/tensor/linear.h"
#include "parallel/tensor/mappings.h"
#include "parallel/tensor/vocab.h"
#include "fake_world.h"
#include "timing.h"

namespace bench = tessera::bench;
namespace tp = tessera::tp;

namespace {

struct TpGptImpl : torch::nn::Module {
  TpGptImpl(const bench::GptConfig& c, tessera::CommPtr g, bool sp, bool overlap) : cfg(c), group(g), sp(sp) {
    emb = register_module("emb", tp::VocabParallelEmbedding(c.vocab, c.d, group, /*seed=*/0));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) {
      auto blk = tp::ParallelBlock(group, c.d, c.heads, sp, fmt::format("blocks.{}", i));
      blk->attn->qkv->opts.overlapGradReduce = overlap;
      blk->mlp->fc1->opts.overlapGradReduce = overlap;
      blocks->push_back(blk);
    }
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
    tp::ParallelLinearOptions ho;
    ho.bias = false;
    ho.sequenceParallel = sp;
    ho.overlapGradReduce = overlap;
    ho.name = "head";
    head = register_module("head", tp::ColumnParallelLinear(group, c.d, c.vocab, ho));
  }

  // tokens, targets [B, T] → the mean cross-entropy (float32 scalar, the same on every rank).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    auto x = emb->forward(tokens.t().contiguous());  // [T, B, d]
    if (sp) x = tp::scatterSeq(x, group);            // this rank's T/tp tokens
    for (const auto& b : *blocks) x = b->as<tp::ParallelBlock>()->forward(x);
    // As the blocks' LayerNorms: with sp each rank normalises its own tokens, so the
    // parameters' gradients are summed over tp.
    x = sp ? at::layer_norm(x, {cfg.d}, tp::copyToRegion(lnf->weight, group), tp::copyToRegion(lnf->bias, group))
           : lnf->forward(x);
    auto logits = head->forward(x);  // [T, B, V/tp] (all tokens)
    return tp::vocabParallelCrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.t().reshape({-1}), group,
                                         cfg.vocab);
  }

  bench::GptConfig cfg;
  tessera::CommPtr group;
  bool sp;
  tp::VocabParallelEmbedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
  tp::ColumnParallelLinear head{nullptr};
};
TORCH_MODULE(TpGpt);

}  // namespace

// A variant: "base", or '+'-joined "chunks<N>" (forward pieces), "carve<N>" (SMs kept free
// of GEMMs beside a collective) and "ring" (the row layers' forward reduction by a ring of
// point-to-point transfers); see tp::LinearOverlap.
tp::LinearOverlap parseVariant(const std::string& spec) {
  tp::LinearOverlap o;
  o.forwardChunks = 1;
  o.smCarveout = 0;
  o.ring = false;
  for (const auto& part : bench::splitList(spec, '+')) {
    if (auto n = bench::numberedPart(part, "chunks")) {
      o.forwardChunks = *n;
    } else if (auto c = bench::numberedPart(part, "carve")) {
      o.smCarveout = *c;
    } else if (part == "ring") {
      o.ring = true;
    } else {
      TESSERA_CHECK(part == "base", "tp_bench: unknown variant part '{}' in '{}' (base, chunks<N>, carve<N>, ring)",
                    part, spec);
    }
  }
  return o;
}

int main(int argc, char** argv) try {
  bool sp = false, overlap = true;
  std::vector<std::string> variants;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--variants" && i + 1 < argc) {
      variants = bench::splitList(argv[++i], ',');
      continue;
    }
    TESSERA_CHECK(a == "--sp" || a == "--no-overlap", "usage: {} [--sp] [--no-overlap] [--variants LIST] (got {})",
                  argv[0], a);
    (a == "--sp" ? sp : overlap) = (a == "--sp");
  }
  const bench::GptConfig cfg = bench::gptConfigFromEnv();
  const int64_t batch = bench::envInt("B", 16);
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  auto ctx = bench::initWorld();
  const auto& world = ctx.world;
  const auto device = ctx.device;
  bench::useDevice(device);
  TESSERA_CHECK(!sp || cfg.seqLen % world->size() == 0, "tp_bench: T={} not divisible by tp={}", cfg.seqLen,
                world->size());

  torch::manual_seed(0);  // the same full weights on every rank; each keeps its shards
  TpGpt model(cfg, world, sp, overlap);
  model->to(device);

  // The same batch on every rank (tensor parallelism shares it), as the anchor's tp mode.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto x = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);
  auto y = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);

  const std::string baseName = std::string("tessera-tp") + (sp ? "-sp" : "") + (overlap ? "" : "-nooverlap");
  const bool explicitVariants = !variants.empty();
  if (!explicitVariants) variants.push_back("default");  // the layers' defaults (environment)
  for (const auto& spec : variants) {
    // "default": TESSERA_TP_FORWARD_CHUNKS / TESSERA_OVERLAP_SM_CARVEOUT / TESSERA_TP_RING.
    tp::LinearOverlap ov = tp::LinearOverlap::fromSettings(ctx.settings);
    if (spec != "default") ov = parseVariant(spec);
    tp::setOverlap(*model, ov);
    bench::FusedAdamW opt(model->parameters());
    double lastLoss = 0;
    bench::resetPeakMemory(device);
    auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
      at::Tensor loss;
      {
        bench::Bf16Autocast autocast(device.is_cuda());
        loss = model->loss(x, y);
      }
      loss.backward();
      opt.step();
      opt.zeroGrad(/*setToNone=*/true);
      lastLoss = loss.item<double>();
    });
    std::string system = spec == "default" || spec == "base" ? baseName : baseName + "-" + spec;
    bench::BenchResult r{system, "tp", world->size(), static_cast<double>(batch * cfg.seqLen), times,
                         bench::peakMemoryGiB(device),
                         fmt::format("\"tp\": {}, \"batch\": {}, \"sequence_parallel\": {}, \"overlap\": {}, "
                                     "\"variant\": \"{}\", \"forward_chunks\": {}, \"sm_carveout\": {}, "
                                     "\"ring\": {}, \"last_loss\": {}",
                                     world->size(), batch, sp, overlap, spec, ov.forwardChunks, ov.smCarveout, ov.ring,
                                     bench::jsonNumber(lastLoss))};
    if (world->rank() == 0) std::cout << bench::resultLine(cfg, r) << std::endl;
  }
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tp_bench: error: " << e.what() << std::endl;
  return 1;
}
