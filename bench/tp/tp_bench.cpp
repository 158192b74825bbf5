// tessera's side of the tensor-parallel benchmark: the benchmarks' GPT-735M (common/bench_model.h:
// src/models' GPT, the trainer's) with every rank in one tensor-parallel group (tp = world),
// trained as the anchor trains it (bf16 autocast forward, fp32 parameters, fused AdamW lr 1e-4,
// random tokens; batch B=16 shared by all ranks, i.e. every rank sees the same B sequences; 3
// warm-ups then the median of STEPS).
//   torchrun --nproc_per_node=2 --no-python tessera_bench_tp [--sp] [--no-overlap]
// The model's Megatron layout (models/lm.h): vocab-parallel embedding, tp::ParallelBlock (qkv and
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
// Without it, one run with the layers' defaults (tp::LinearOverlap{}).
// Env (read at the top): B, STEPS, D, L, V, T; TESSERA_FAKE_WORLD (common/fake_world.h).
// Rank 0 prints RESULT {json} (common/timing.h) with tp, sequence_parallel, overlap, first_loss
// (the first variant's first step, before any update) and last_loss.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench_model.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "fake_world.h"
#include "fused_adamw.h"
#include "tessera/models/gpt.h"
#include "tessera/parallel/tensor/linear.h"
#include "timing.h"

namespace bench = tessera::bench;
namespace tp = tessera::tp;

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
  const auto cfg = bench::modelFromEnv();
  const int64_t batch = bench::envInt("B", 16);
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  const auto fake = bench::fakeWorldFromEnv();
  auto ctx = bench::initWorld(fake);
  const auto& world = ctx.world;
  const auto device = ctx.device;
  bench::useDevice(device);

  // Every rank builds its shards of the same model (models/lm.h draws the full weights per block).
  auto model = bench::buildModel(cfg, world, tessera::models::ChunkRange::whole(cfg), sp);
  for (auto& b : model->blocks) {
    auto& block = std::dynamic_pointer_cast<tessera::models::GptBlockImpl>(b)->block;
    block->attn->qkv->opts.overlapGradReduce = overlap;
    block->mlp->fc1->opts.overlapGradReduce = overlap;
  }
  model->head->opts.overlapGradReduce = overlap;
  model->to(device);

  // The same batch on every rank (tensor parallelism shares it), as the anchor's tp mode.
  at::Tensor x, y;
  std::tie(x, y) = bench::randomBatch(cfg, batch, bench::kDataSeed, device);

  const std::string baseName = std::string("tessera-tp") + (sp ? "-sp" : "") + (overlap ? "" : "-nooverlap");
  if (variants.empty()) variants.push_back("default");  // the layers' defaults
  std::optional<double> firstLoss;
  for (const auto& spec : variants) {
    // "default": the settings read at the top (TESSERA_TP_FORWARD_CHUNKS, _OVERLAP_SM_CARVEOUT, _TP_RING).
    tp::LinearOverlap ov = tp::LinearOverlap::fromSettings(ctx.settings);
    if (spec != "default") ov = parseVariant(spec);
    tp::setOverlap(*model, ov);
    bench::FusedAdamW opt(model->parameters());
    double lastLoss = 0;
    bench::resetPeakMemory(device);
    auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
      at::Tensor loss;
      {
        tessera::Bf16Autocast autocast(device.is_cuda());
        loss = tessera::models::lmLoss(model->forward(x), y, world, cfg.vocab);
      }
      loss.backward();
      opt.step();
      opt.zeroGrad(/*setToNone=*/true);
      lastLoss = loss.item<double>();
      if (!firstLoss) firstLoss = lastLoss;
    }, world->rank());
    std::string system = spec == "default" || spec == "base" ? baseName : baseName + "-" + spec;
    bench::BenchResult r{system, "tp", world->size(), static_cast<double>(batch * cfg.seqLen), times,
                         bench::peakMemoryGiB(device),
                         fmt::format("\"tp\": {}, \"batch\": {}, \"sequence_parallel\": {}, \"overlap\": {}, "
                                     "\"variant\": \"{}\", \"forward_chunks\": {}, \"sm_carveout\": {}, "
                                     "\"ring\": {}, \"first_loss\": {}, \"last_loss\": {}",
                                     world->size(), batch, sp, overlap, spec, ov.forwardChunks, ov.smCarveout, ov.ring,
                                     bench::jsonNumber(*firstLoss), bench::jsonNumber(lastLoss))};
    if (world->rank() == 0) std::cout << bench::resultLine(cfg, r, fake) << std::endl;
  }
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tp_bench: error: " << e.what() << std::endl;
  return 1;
}
