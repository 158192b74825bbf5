// The composer; see parallelize.h.
#include "tessera/train/parallelize.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessera/common/autocast.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/models/moe.h"
#include "tessera/optim/adamw.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/train/model_spec.h"

namespace tessera::train {

namespace {

// --fp8 on the blocks' linears (and with --fp8-experts their routed experts), but those of
// --fp8-skip-blocks (the embedding and the head stay as they are, as the peers keep them).
void setFp8(const Config& c, models::LmChunkImpl& chunk) {
  const auto layers = static_cast<int>(c.model.cfg.layers);
  const auto& skip = c.precision.fp8SkipBlocks;
  for (size_t i = 0; i < chunk.blocks.size(); ++i) {
    const int b = chunk.range.firstBlock + static_cast<int>(i);
    if (std::any_of(skip.begin(), skip.end(), [&](int s) { return (s < 0 ? s + layers : s) == b; })) continue;
    tp::setFp8(*chunk.blocks[i], c.precision.fp8);
    for (const auto& m : chunk.blocks[i]->modules(/*include_self=*/false)) {
      if (auto* moe = dynamic_cast<models::MoeImpl*>(m.get())) moe->fp8 = c.precision.fp8Experts;
    }
  }
}

// This rank's chunks, built and set up for the layout.
std::vector<models::LmChunk> buildChunks(const Config& c, const Parallel& p, const CommPtr& kvGroup, at::Device device) {
  const auto& cfg = c.model.cfg;
  models::LayerOptions lo;
  lo.sequenceParallel = c.parallel.sequenceParallel;
  lo.recompute = c.precision.recompute;
  lo.seed = c.seed;
  lo.fusedKernels = c.precision.fusedKernels;
  lo.context = p.mesh->cpGroup();  // null without --cp
  lo.experts = p.mesh->expertGroup();  // null without --ep
  lo.repeatKvHeads = c.precision.repeatKvHeads;
  lo.moeLossScale = 1.0 / c.parallel.microBatches;  // as the LM loss of each micro-batch
  lo.moeForceBalanced = c.model.moeForceBalanced;
  std::vector<models::LmChunk> chunks;
  for (int k = 0; k < c.parallel.chunks; ++k) {
    const auto range = chunkRange(p.partition, p.partition.stageOf(p.mesh->coord().pp, k));
    auto chunk = models::LmChunk(cfg, p.mesh->tpGroup(), kvGroup, range, lo);
    chunk->to(device);
    tp::setOverlap(*chunk, c.parallel.overlap);
    // Weight gradients summed by the GEMM in float32 across micro-batches: into .grad (DDP, whose
    // hooks still see them), or into FSDP's unit accumulation through gradient sinks (its parameters
    // are bf16 views).
    if (usesFusedWgrad(c)) tp::setAccumulateGradInGemm(*chunk, true);
    // The tied table's bucket (FSDP: its unit's reduce-scatter) leaves with the head's gradient; the
    // lookup's rows are gathered at the end of backward instead (Ddp/FsdpOptions::gatherEmbeddingRows).
    if (gathersEmbeddingRows(c)) {
      chunk->emb->accumulateGrad = true;  // DDP's setAccumulateGradInGemm set it already; FSDP's sink takes the rows
      chunk->emb->untracked = true;
    }
    if (c.precision.fp8 != fp8::Recipe::Off) setFp8(c, *chunk);
    chunks.push_back(chunk);
  }
  return chunks;
}

// Elements of this rank's chunks' parameters.
int64_t chunkNumel(const Parallel& p) {
  int64_t numel = 0;
  for (const auto& chunk : p.chunks) {
    for (const auto& t : chunk->parameters()) numel += t.numel();
  }
  return numel;
}

// --fsdp-keep-gathered (config.h): on; under auto, FSDP with more than one micro-batch where this
// rank's units all gathered (paramDtype; with FP8 each element's codes and their transpose, 2 bytes
// more) fit a quarter of the GPU's memory. Auto is off on CPUs (no budget known).
bool keepsGatheredThroughStep(const Config& c, const Parallel& p, const at::Device& device) {
  const auto& par = c.parallel;
  if (par.dpMode != DpMode::Fsdp || par.fsdpKeepGathered == OnOffAuto::Off) return false;
  if (par.fsdpKeepGathered == OnOffAuto::On) return true;
  if (par.microBatches < 2 || !device.is_cuda()) return false;
  const int bytes = (c.precision.precision == Precision::Bf16 ? 2 : 4) + (c.precision.fp8 != fp8::Recipe::Off ? 2 : 0);
  return static_cast<double>(chunkNumel(p) * bytes) / (1ull << 30) <= 0.25 * totalMemoryGiB(device);
}

// --fsdp-accumulate (config.h): sharded, or under auto FSDP with more than one micro-batch where a
// float32 copy of this rank's parameters (noSync's accumulation) would take more than a quarter of the
// GPU's memory. Auto is local on CPUs.
bool accumulatesSharded(const Config& c, const Parallel& p, const at::Device& device) {
  const auto& par = c.parallel;
  if (par.dpMode != DpMode::Fsdp || par.fsdpAccumulate == FsdpAccumulate::Local) return false;
  if (par.fsdpAccumulate == FsdpAccumulate::Sharded) return true;
  if (par.microBatches < 2 || !device.is_cuda()) return false;
  return static_cast<double>(4 * chunkNumel(p)) / (1ull << 30) > 0.25 * totalMemoryGiB(device);
}

DataParallelOptions wrapperOptions(const Config& c, const Parallel& p) {
  DataParallelOptions o;
  o.adam.lr = c.optim.lr.lr;
  o.adam.weightDecay = c.optim.weightDecay;
  o.decays = [emb = c.optim.decayEmbeddings](const std::string& name) { return optim::decaysByName(name, emb); };
  o.multiTensorAdam = c.precision.fusedKernels;
  const bool bf16 = c.precision.precision == Precision::Bf16;
  auto& d = o.ddp;
  d.gradientAsBucketView = !c.parallel.gradReduceBf16;  // bf16: buckets of their own, cast back into .grad
  if (c.parallel.gradReduceBf16) d.commDtype = at::kBFloat16;
  d.bucketCapBytes = static_cast<size_t>(c.parallel.ddpBucketMiB) << 20;
  d.smCarveout = c.parallel.overlap.smCarveout;
  d.overwriteStaleGrads = !c.parallel.zeroGrads;  // the step's first weight-gradient GEMM writes .grad
  d.gatherEmbeddingRows = gathersEmbeddingRows(c);
  // Interleaved: the last backward runs chunk 0 only; the other chunks' parameters then contribute
  // the gradients they accumulated (DDP's unused-parameter path).
  d.findUnusedParameters = c.parallel.chunks > 1;
  auto& f = o.fsdp;
  f.paramDtype = bf16 ? at::kBFloat16 : at::kFloat;
  if (c.parallel.gradReduceBf16) f.reduceDtype = at::kBFloat16;
  f.gatherAfterStep = true;  // the next step's first units gather beside the optimizer
  f.gatherEmbeddingRows = gathersEmbeddingRows(c);
  f.accumulateGradInGemm = usesFusedWgrad(c);
  o.keepGatheredThroughStep = p.fsdpKeptThroughStep;
  o.reduceEveryMicroBatch = p.fsdpShardedAccumulation;
  o.autoPrefetchBudget = c.parallel.fsdpPrefetchMiB < 0;
  if (!o.autoPrefetchBudget) f.prefetchBudgetBytes = static_cast<size_t>(c.parallel.fsdpPrefetchMiB) << 20;
  for (const auto& chunk : p.chunks) o.chunkNames.push_back(fmt::format("stage{}", chunk->range.stage));
  o.keepGathered = keepGathered;
  o.ep = p.mesh->expertGroup();
  o.expertData = p.mesh->expertDataGroup();
  return o;
}

// The executor: each chunk's parts through the wrapper, under bf16 autocast on GPUs.
std::unique_ptr<pipeline::PipelineExecutor> makePipeline(const Config& c, Parallel& p, at::Device device,
                                                         const ParallelizeHooks& hooks) {
  std::vector<pipeline::PipelineExecutor::ChunkFn> fns;
  const bool autocast = c.precision.precision == Precision::Bf16 && device.is_cuda();
  for (size_t k = 0; k < p.chunks.size(); ++k) {
    fns.push_back([dp = p.dp.get(), k, n = p.chunks[k]->parts().size(), autocast](const at::Tensor& x) {
      Bf16Autocast cast(autocast);
      at::Tensor h = x;
      for (size_t part = 0; part < n; ++part) h = dp->run(k, part, h);
      return h;
    });
  }
  pipeline::ExecutorOptions eo;
  eo.device = device;
  auto schedule = pipeline::makeSchedule(c.parallel.schedule, c.parallel.pp, c.parallel.microBatches,
                                         c.parallel.chunks, c.parallel.extraWarmup);
  // A split backward (ZB-H1) finishes the weight gradients after the last B: the wrapper then
  // reduces after the step (DataParallel::reduceHeld), not in the last backward.
  const bool splits = schedule.splitsBackward();
  eo.beforeBackward = [dp = p.dp.get(), splits, before = hooks.beforeBackward](int micro, int chunk, bool last) {
    if (last && !splits) dp->release();  // gradients are reduced over the data group in this backward
    if (before) before(micro, chunk, last);
  };
  eo.afterBackward = hooks.afterBackward;
  auto loss = [tp = p.mesh->tpGroup(), vocab = c.model.cfg.vocab, fused = c.precision.fusedKernels](
                  const at::Tensor& y, const at::Tensor& t) { return models::lmLoss(y, t, tp, vocab, fused); };
  return std::make_unique<pipeline::PipelineExecutor>(p.mesh->ppGroup(), std::move(schedule), std::move(fns),
                                                      std::move(loss), eo);
}

}  // namespace

std::vector<checkpoint::Piece> Parallel::pieces() const {
  std::vector<checkpoint::Piece> out;
  for (auto c : chunks) {  // a holder copy: pieces() is not const
    for (auto& p : c->pieces()) out.push_back(std::move(p));
  }
  return out;
}

void Parallel::syncTiedEmbeddings() {
  if (partition.vShape) {  // ZB-V: the embedding (chunk 0) and the head's copy (chunk 1) on pp rank 0
    if (chunks.size() != 2 || !chunks[0]->tiedTable().defined() || !chunks[1]->tiedTable().defined()) return;
    auto g0 = dp->partGrad(0, 0), g1 = dp->partGrad(1, chunks[1]->parts().size() - 1);
    TESSERA_CHECK(g0.defined() && g1.defined(), "train: rank {}: the tied embedding table has no gradient on {}",
                  mesh->world()->rank(), g0.defined() ? "the head's stage" : "the first stage");
    at::NoGradGuard ng;
    g0.add_(g1);
    g1.copy_(g0);
    return;
  }
  if (!embGroup) return;
  for (size_t k = 0; k < chunks.size(); ++k) {
    auto& c = chunks[k];
    if (!c->tiedTable().defined()) continue;
    // The table's part: the embedding (first stage) or the head's copy (last); FSDP: its unit holds
    // only the table on both stages, so the shards line up.
    const size_t part = c->first ? 0 : c->parts().size() - 1;
    auto g = dp->partGrad(k, part);
    TESSERA_CHECK(g.defined(), "train: rank {}: the tied embedding table of stage {} has no gradient",
                  mesh->world()->rank(), c->range.stage);
    embGroup->allReduce(g, ReduceOp::Sum)->wait();
  }
}

Parallel parallelize(const Config& c, const Context& ctx, const ParallelizeHooks& hooks) {
  useDevice(ctx.device);
  Parallel p;
  const auto& par = c.parallel;
  p.mesh = std::make_unique<ProcessMesh>(ctx.world, par.dp, par.pp, par.tp, par.cp, par.ep);
  const auto me = p.mesh->coord();
  const auto& cfg = c.model.cfg;
  const bool vShape = par.schedule == pipeline::ScheduleKind::ZeroBubbleV;
  p.partition = partitionModel(cfg, par.pp, par.chunks, par.layersPerStage, vShape);
  // Collective splits, in the same order on every rank: the family's group (Llama, tp > kv heads),
  // then the embedding group (tied embeddings over pp > 1).
  CommPtr kvGroup = models::familyGroup(cfg, p.mesh->tpGroup());
  if (cfg.tiedEmbeddings && par.pp > 1 && !vShape) {  // ZB-V: both ends on pp rank 0 (syncTiedEmbeddings)
    const bool end = me.pp == 0 || me.pp == par.pp - 1;
    p.embGroup = ctx.world->split(end ? (me.dp * par.cp + me.cp) * par.tp + me.tp : -1, me.pp, "emb");
  }
  p.chunks = buildChunks(c, p, kvGroup, ctx.device);
  if (hooks.onModel) hooks.onModel(p.chunks);
  ModelChunks parts;
  for (auto& chunk : p.chunks) parts.push_back(chunk->parts());
  p.fsdpKeptThroughStep = keepsGatheredThroughStep(c, p, ctx.device);
  p.fsdpShardedAccumulation = accumulatesSharded(c, p, ctx.device);
  const auto o = wrapperOptions(c, p);
  p.dp = par.dpMode == DpMode::Fsdp ? shard(parts, p.mesh->dataGroup(), o) : replicate(parts, p.mesh->dataGroup(), o);
  p.pipeline = makePipeline(c, p, ctx.device, hooks);
  return p;
}

}  // namespace tessera::train
