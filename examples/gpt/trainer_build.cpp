// train_gpt's 3D training loop: setup (see trainer.h); the step is trainer.cpp's.
#include <fmt/format.h>
#include <torch/types.h>

#include <algorithm>

#include "common/autocast.h"
#include "common/device.h"
#include "common/log.h"
#include "parallel/tensor/linear.h"
#include "pipeline/schedule.h"
#include "trainer_state.h"

namespace tessera::gpt {

Trainer::Trainer(TrainOptions o, const Context& ctx) : s_(std::make_unique<State>()) {
  s_->o = std::move(o);
  s_->ctx = ctx;
  s_->device = ctx.device;
  s_->build();
}
Trainer::~Trainer() = default;

std::vector<ChunkParam> Trainer::State::params() const {
  std::vector<ChunkParam> out;
  for (auto c : chunks) {  // a holder copy: params() is not const
    for (auto& p : c->params()) out.push_back(std::move(p));
  }
  return out;
}

// --fp8: the blocks' linears, but those of --fp8-skip-blocks (the embedding and the head stay as
// they are, as the peers keep them).
void Trainer::State::setFp8(models::LmChunkImpl& chunk) {
  const auto layers = static_cast<int>(o.cfg.layers);
  auto skipped = [&](int b) {
    return std::any_of(o.fp8SkipBlocks.begin(), o.fp8SkipBlocks.end(),
                       [&](int s) { return (s < 0 ? s + layers : s) == b; });
  };
  const size_t n = std::max(chunk.gptBlocks.size(), chunk.llamaBlocks.size());
  for (size_t i = 0; i < n; ++i) {
    const int b = chunk.firstBlock + static_cast<int>(i);
    if (skipped(b)) continue;
    if (i < chunk.gptBlocks.size()) tp::setFp8(*chunk.gptBlocks[i], o.fp8);
    if (i < chunk.llamaBlocks.size()) tp::setFp8(*chunk.llamaBlocks[i], o.fp8);
  }
}

void Trainer::State::build() {
  useDevice(device);
  mesh = std::make_unique<ProcessMesh>(ctx.world, o.dp, o.pp, o.tp, o.cp);
  const auto me = mesh->coord();
  const auto& cfg = o.cfg;
  part = models::partitionModel(cfg, o.pp, o.chunks, o.layersPerStage);
  if (!o.checkpointDir.empty() && o.asyncCheckpoint) {
    saver = std::make_unique<checkpoint::AsyncSaver>(ctx.world, ctx.store, ctx.settings.timeout);
  }
  batches = std::make_unique<Batches>(o, me.dp, device, me.cp);
  // Collective splits, in the same order on every rank: the kv group (Llama, tp > kv heads),
  // then the embedding group (tied embeddings over pp > 1).
  CommPtr kvGroup = cfg.arch == models::Arch::Llama ? models::llamaKvGroup(cfg, mesh->tpGroup()) : nullptr;
  if (cfg.tiedEmbeddings && o.pp > 1) {
    const bool end = me.pp == 0 || me.pp == o.pp - 1;
    embGroup = ctx.world->split(end ? (me.dp * o.cp + me.cp) * o.tp + me.tp : -1, me.pp, "emb");
  }
  models::ChunkOptions co;
  co.sequenceParallel = o.sequenceParallel;
  co.recompute = o.recompute;
  co.seed = o.seed;
  co.fusedKernels = o.fusedKernels;
  co.contextGroup = mesh->cpGroup();  // null without --cp
  co.repeatKvHeads = o.repeatKvHeads;
  for (int c = 0; c < o.chunks; ++c) {
    auto chunk = models::LmChunk(cfg, mesh->tpGroup(), kvGroup, part, part.stageOf(me.pp, c), co);
    chunk->to(device);
    tp::setOverlap(*chunk, o.overlap);
    // Weight gradients summed by the GEMM into .grad across micro-batches: DDP's hooks still see
    // them (tests/parallel/ddp); FSDP's bf16 unit parameters and the tp > 1 ops cannot take it.
    if (usesFusedWgrad(o)) tp::setAccumulateGradInGemm(*chunk, true);
    // The tied table's bucket (FSDP: its unit's reduce-scatter) leaves with the head's gradient; the
    // lookup's rows are gathered at the end of backward instead (Ddp/FsdpOptions::gatherEmbeddingRows).
    if (gathersEmbeddingRows(o, cfg)) {
      chunk->emb->accumulateGrad = true;  // DDP's setAccumulateGradInGemm set it already; FSDP's sink takes the rows
      chunk->emb->untracked = true;
    }
    if (o.fp8 != fp8::Recipe::Off) setFp8(*chunk);
    chunks.push_back(chunk);
  }
  if (!o.initFromHf.empty()) initFromHf();
  const bool bf16 = o.precision == Precision::Bf16;
  AdamWOptions ao;
  ao.lr = o.lr.lr;
  ao.weightDecay = o.weightDecay;
  const bool decayEmb = o.decayEmbeddings;
  auto decays = [decayEmb](const std::string& name) { return optim::decaysByName(name, decayEmb); };
  if (o.dpMode == DpMode::Fsdp) {
    std::vector<FsdpUnitSpec> units;
    for (auto& c : chunks) {
      firstUnit.push_back(units.size());
      for (auto& u : c->fsdpUnits()) units.push_back(std::move(u));
    }
    FsdpOptions fo;
    fo.paramDtype = bf16 ? at::kBFloat16 : at::kFloat;
    if (o.gradReduceBf16) fo.reduceDtype = at::kBFloat16;
    fo.gatherAfterStep = true;  // the next step's first units gather beside the optimizer
    fo.gatherEmbeddingRows = gathersEmbeddingRows(o, cfg);
    fo.prefetchBudgetBytes = o.fsdpPrefetchMiB >= 0 ? static_cast<size_t>(o.fsdpPrefetchMiB) << 20
                                                    : autoPrefetchBudget(units, fo.paramDtype, fo.reshardAfterForward);
    if (isLogger()) log::info("train_gpt: FSDP over {} units, prefetch budget {} MiB{}{}", units.size(),
                              fo.prefetchBudgetBytes >> 20, o.fsdpPrefetchMiB < 0 ? " (auto)" : "",
                              fo.gatherEmbeddingRows ? "; the tied table's lookup rows gathered" : "");
    fsdp = std::make_unique<FullyShardedDataParallel>(std::move(units), mesh->dataGroup(), fo);
    shardedAdam = std::make_unique<ShardedAdamW>(*fsdp, ao, decays);
  } else {
    DistributedDataParallel::Named named;
    std::vector<at::Tensor> tensors;
    std::vector<std::string> names;
    std::vector<bool> decay;
    for (const auto& p : params()) {
      named.emplace_back(p.name, p.tensor);
      tensors.push_back(p.tensor);
      names.push_back(p.name);
      decay.push_back(decays(p.name));
    }
    DdpOptions dopt;
    // bf16 reduction: buckets of their own in bf16, cast back into the float32 .grad.
    dopt.gradientAsBucketView = !o.gradReduceBf16;
    if (o.gradReduceBf16) dopt.commDtype = at::kBFloat16;
    dopt.bucketCapBytes = static_cast<size_t>(o.ddpBucketMiB) << 20;
    dopt.smCarveout = o.overlap.smCarveout;
    // The step's first weight-gradient GEMM writes .grad (beta = 0) instead of adding to zeros.
    dopt.overwriteStaleGrads = !o.zeroGrads;
    dopt.gatherEmbeddingRows = gathersEmbeddingRows(o, cfg);
    // Interleaved: the last backward runs chunk 0 only; the other chunks' parameters then
    // contribute the gradients they accumulated (DDP's unused-parameter path).
    dopt.findUnusedParameters = o.chunks > 1;
    ddp = std::make_unique<DistributedDataParallel>(named, DistributedDataParallel::Named{}, mesh->dataGroup(), dopt);
    adam = std::make_unique<optim::AdamW>(tensors, names, decay, ao, /*multiTensor=*/o.fusedKernels);
  }

  std::vector<pipeline::PipelineExecutor::ChunkFn> fns;
  for (int c = 0; c < o.chunks; ++c) {
    fns.push_back([this, c, bf16, units = chunks[c]->partUnits()](const at::Tensor& x) {
      Bf16Autocast autocast(bf16 && device.is_cuda());
      auto parts = chunks[c]->parts();
      at::Tensor h = x;
      for (size_t k = 0; k < parts.size(); ++k) {
        h = fsdp ? fsdp->runUnit(firstUnit[c] + units[k], h, parts[k]) : parts[k](h);
      }
      return h;
    });
  }
  pipeline::ExecutorOptions eo;
  eo.device = device;
  // A split backward (ZB-H1) finishes the weight gradients after the last B: DDP then averages
  // them after the step (reduceGradients, in step()), not in the last backward.
  eo.beforeBackward = [this](int, int, bool last) {
    if (last && !exec->schedule().splitsBackward()) {  // gradients are reduced over dp in this backward
      ddpNoSync.reset();
      fsdpNoSync.reset();
    }
    if (o.breakdown) synchronizeDevice(device);
    if (measureMemory() && mem.beforeBackward < 0) {  // the step's first backward ends its forward phase
      mem.beforeBackward = allocatedMemoryGiB(device);
      mem.peakForward = endMemoryPhase();
    }
    backwardStart = Clock::now();
  };
  eo.afterBackward = [this](int, int, bool last) {
    if (o.breakdown) synchronizeDevice(device);
    (last ? lastBackwardMs : (backwardMs.emplace_back(), backwardMs.back())) = msSince(backwardStart);
  };
  const int64_t vocab = cfg.vocab;
  auto tpGroup = mesh->tpGroup();
  const bool fused = co.fusedKernels;
  exec = std::make_unique<pipeline::PipelineExecutor>(
      mesh->ppGroup(),
      pipeline::makeSchedule(o.schedule, o.pp, o.microBatches, o.chunks, o.extraWarmup), fns,
      [tpGroup, vocab, fused](const at::Tensor& y, const at::Tensor& t) {
        return models::lmLoss(y, t, tpGroup, vocab, fused);
      },
      eo);
}

}  // namespace tessera::gpt
