// train_gpt's 3D training loop: setup and one step (see trainer.h).
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>

#include "common/autocast.h"
#include "common/device.h"
#include "common/error.h"
#include "common/log.h"
#include "common/profiler.h"
#include "kernels/fp8.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "parallel/tensor/linear.h"
#include "parallel/grad_norm.h"
#include "pipeline/schedule.h"
#include "trainer_state.h"

namespace tessera::gpt {

namespace {
using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

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
  for (int c = 0; c < o.chunks; ++c) {
    auto chunk = models::LmChunk(cfg, mesh->tpGroup(), kvGroup, part, part.stageOf(me.pp, c), co);
    chunk->to(device);
    tp::setOverlap(*chunk, o.overlap);
    // Weight gradients summed by the GEMM into .grad across micro-batches: DDP's hooks still see
    // them (tests/parallel/ddp); FSDP's bf16 unit parameters and the tp > 1 ops cannot take it.
    if (usesFusedWgrad(o)) tp::setAccumulateGradInGemm(*chunk, true);
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
    fo.prefetchBudgetBytes = static_cast<size_t>(o.fsdpPrefetchMiB) << 20;
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
    dopt.gradientAsBucketView = true;
    dopt.smCarveout = o.overlap.smCarveout;
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

StepReport Trainer::State::step(int64_t s) {
  StepReport rep;
  rep.step = s + 1;
  auto batch = batches->next(s);
  backwardMs.clear();
  lastBackwardMs = 0;
  synchronizeDevice(device);
  mem = {};
  if (measureMemory()) {
    endMemoryPhase();  // the last step's tail (logging, validation, checkpoints) is in no phase's peak
    mem.stepStart = allocatedMemoryGiB(device);
  }
  const auto t0 = Clock::now();
  if (ddp) ddpNoSync = std::make_unique<DistributedDataParallel::NoSync>(*ddp);
  if (fsdp) fsdpNoSync = std::make_unique<FullyShardedDataParallel::NoSync>(*fsdp);
  at::Tensor loss;
  try {
    // Each weight cast to bf16 once per step, not per micro-batch (400 casts a step on a stage of
    // llama3-1b's 16-micro-batch pipeline); cleared before the optimizer changes the weights.
    CudaAutocastCacheScope castOncePerStep(o.precision == Precision::Bf16 && device.is_cuda());
    // FP8 on GPUs: each weight's codes cast once per step too (parallel/tensor/fp8_weight_cache.h);
    // not under FSDP, whose gathered weights the cache would keep alive.
    tp::Fp8WeightCacheScope fp8CodesOncePerStep(o.fp8 != fp8::Recipe::Off && o.dpMode != DpMode::Fsdp);
    loss = exec->step(firstPp() ? batch.tokens : at::Tensor(), lastPp() ? batch.targets : at::Tensor());
  } catch (...) {
    ddpNoSync.reset();
    fsdpNoSync.reset();
    throw;
  }
  if (exec->schedule().splitsBackward() && ddpNoSync) {
    ddpNoSync.reset();
    ddp->reduceGradients();
  }
  TESSERA_CHECK(!ddpNoSync && !fsdpNoSync, "train_gpt: rank {} ran no backward in step {}", ctx.world->rank(), s);
  synchronizeDevice(device);
  rep.pipelineMs = msSince(t0);
  if (measureMemory()) mem.peakBackward = endMemoryPhase();
  const auto t1 = Clock::now();
  syncTiedEmbeddings();
  std::vector<CommPtr> sumOver{mesh->tpGroup(), mesh->ppGroup()};
  if (fsdp) sumOver.insert(sumOver.begin(), mesh->dataGroup());
  rep.lr = optim::lrAt(o.lr, s);
  // Clipping's coefficient goes to AdamW, which scales the gradients as it reads them (one pass
  // over them less); the norm is read back once the update is queued.
  const auto clip = globalGradNorm(gradPieces(), sumOver, o.clip, device);
  const auto scale = o.clip > 0 ? clip.coef : at::Tensor();
  if (saver) saver->beforeUpdate();  // a save's host copies read the parameters: update after them
  if (fsdp) {
    shardedAdam->options().lr = rep.lr;
    shardedAdam->step(scale);
    shardedAdam->zeroGrad();
  } else {
    adam->setLr(rep.lr);
    adam->step(scale);
    ddp->zeroGrad();
  }
  rep.gradNorm = clip.norm.item<double>();
  auto l = loss.reshape({1}).to(at::kFloat).clone();
  if (mesh->dataGroup()->size() > 1) mesh->dataGroup()->allReduce(l, ReduceOp::Avg)->wait();
  rep.loss = l.item<double>();
  synchronizeDevice(device);
  rep.optimizerMs = msSince(t1);
  rep.stepMs = msSince(t0);

  const int v = o.chunks, m = o.microBatches, p = o.pp;
  rep.bubbleMsEst = rep.pipelineMs * (p - 1) / static_cast<double>(v * m + p - 1);
  // Host clocks time a backward only when it blocks: always on the CPU, with --breakdown on GPUs.
  if (!backwardMs.empty() && (!device.is_cuda() || o.breakdown)) {
    double mean = 0;
    for (double b : backwardMs) mean += b;
    mean /= static_cast<double>(backwardMs.size());
    rep.dpSyncMsEst = std::max(0.0, lastBackwardMs - mean);
  }
  rep.computeMsEst = rep.pipelineMs - rep.bubbleMsEst - std::max(0.0, rep.dpSyncMsEst);
  const double tokens = static_cast<double>(o.batch * o.cfg.seqLen);
  rep.tokensPerS = tokens / (rep.stepMs / 1e3);
  if (o.peakTflops > 0) {
    rep.mfu = rep.tokensPerS * models::flopsPerToken(o.cfg) / (ctx.world->size() * o.peakTflops * 1e12);
  }
  if (o.fp8 != fp8::Recipe::Off) {  // validation's casts are counted in the next step
    const auto c = fp8::takeCounts(), g = kernels::takeFp8Counts();  // the CPU emulation's, the GPU casts'
    auto sums = at::tensor({c.values + g.values, c.underflows + g.underflows, c.saturated + g.saturated}, at::kLong)
                    .to(device);
    ctx.world->allReduce(sums, ReduceOp::Sum)->wait();
    const auto h = sums.cpu();
    rep.fp8Values = h[0].item<int64_t>(), rep.fp8Underflows = h[1].item<int64_t>(), rep.fp8Saturated = h[2].item<int64_t>();
  }
  if (measureMemory()) mem.peakOptimizer = endMemoryPhase();
  const double runPeak = measureMemory() ? runPeakGiB : peakMemoryGiB(device);
  auto peak = at::tensor({runPeak, mem.stepStart, mem.beforeBackward, mem.peakForward, mem.peakBackward,
                          mem.peakOptimizer},
                         at::TensorOptions().dtype(at::kFloat))
                  .to(device);
  ctx.world->allReduce(peak, ReduceOp::Max)->wait();  // the fullest rank's
  const auto h = peak.cpu();
  const float* mv = h.data_ptr<float>();
  rep.peakMemGiB = mv[0];
  rep.memStepStartGiB = mv[1], rep.memBeforeBackwardGiB = mv[2], rep.memPeakForwardGiB = mv[3];
  rep.memPeakBackwardGiB = mv[4], rep.memPeakOptimizerGiB = mv[5];
  return rep;
}

std::vector<StepReport> Trainer::run() {
  auto& s = *s_;
  s.loadCheckpoint();
  s.openLog();
  std::vector<StepReport> out;
  StepProfiler profiler(s.ctx.world->rank(), s.o.profile, s.o.profileCpu);
  for (int64_t i = s.startStep; i < s.o.steps; ++i) {
    profiler.beginStep(i);
    out.push_back(s.step(i));
    profiler.endStep(i);
    const bool eval = s.o.evalEvery > 0 && ((i + 1) % s.o.evalEvery == 0 || i + 1 == s.o.steps);
    if (eval) out.back().validLoss = s.validationLoss();
    s.logStep(out.back());
    const bool every = s.o.checkpointEvery > 0 && (i + 1) % s.o.checkpointEvery == 0;
    if (!s.o.checkpointDir.empty() && (every || i + 1 == s.o.steps)) s.saveCheckpoint(i + 1);
    if (s.o.saveHfEvery > 0 && (i + 1) % s.o.saveHfEvery == 0) s.saveHf(fmt::format("{}/step-{}", s.o.saveHfDir, i + 1));
    if (s.saver) s.saver->poll();  // a failed save ends the run here, not at the next save
    injectFault(s.ctx.settings, fmt::format("kill-after-step-{}", i + 1), s.ctx.world->rank(), "train_gpt");
  }
  if (!s.o.saveHfAtEnd.empty()) s.saveHf(s.o.saveHfAtEnd);
  if (s.saver) s.saver->wait();  // the last checkpoint is published before the run ends
  return out;
}

}  // namespace tessera::gpt
