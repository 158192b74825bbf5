// One training step (trainer.h): queued without waiting for the device, its results read back
// later (finishStep), its time device-complete.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "kernels/fp8.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "tessera/common/autocast.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"
#include "tessera/common/log.h"
#include "tessera/common/profiler.h"
#include "tessera/models/llama.h"
#include "tessera/parallel/grad_norm.h"
#include "train/trainer_state.h"

namespace tessera::train {

namespace {
// `v` on `device` without a host synchronization: from pinned memory, the copy queued.
at::Tensor toDevice(const std::vector<float>& v, const at::Device& device) {
  auto host = at::tensor(v);
  return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
}

// --nan-policy skip-step gives up after this many skipped updates in a row: the run is not training.
constexpr int kMaxSkippedInARow = 10;
}  // namespace

bool Trainer::State::deferReports() const { return device.is_cuda() && !o.logging.breakdown; }

Trainer::State::Pending Trainer::State::queueStep(const data::TokenBatch& batch) {
  const int64_t s = stepsDone;
  Pending p{StepReport{}, std::make_shared<StreamMarks>(device), {}, {}};
  p.rep.step = s + 1;
  // The run's first step learns shapes and builds buckets (host round trips); the later ones are checked.
  SyncCheck checked(device, s > startStep ? o.logging.syncDebug : SyncDebug::Off);
  backwardMs.clear();
  lastBackwardMs = 0;
  if (o.logging.breakdown) synchronizeDevice(device);
  mem = {};
  if (measureMemory()) {
    endMemoryPhase();  // the last step's tail (logging, validation, checkpoints) is in no phase's peak
    mem.stepStart = allocatedMemoryGiB(device);
  }
  p.marks->mark();
  auto& dp = *par.dp;
  dp.hold();
  at::Tensor loss;
  try {
    // Each weight cast to bf16 once per step, not per micro-batch (400 casts a step on a stage of
    // llama3-1b's 16-micro-batch pipeline); cleared before the optimizer changes the weights.
    CudaAutocastCacheScope castOncePerStep(o.precision.precision == Precision::Bf16 && device.is_cuda());
    // FP8: each weight's codes cast once per step too (parallel/tensor/fp8_weight_cache.h); under FSDP
    // only where its units stay gathered through the step (else the cache keeps gathered weights alive).
    tp::Fp8WeightCacheScope fp8CodesOncePerStep(o.precision.fp8 != fp8::Recipe::Off &&
                                                (o.parallel.dpMode != DpMode::Fsdp || par.fsdpKeptThroughStep));
    loss = par.pipeline->step(par.firstStage() ? batch.tokens : at::Tensor(),
                              par.lastStage() ? batch.targets : at::Tensor());
  } catch (...) {
    dp.release();
    throw;
  }
  if (par.pipeline->schedule().splitsBackward() && dp.held()) dp.reduceHeld();
  TESSERA_CHECK(!dp.held(), "train: rank {} ran no backward in step {}", ctx.world->rank(), s);
  ++stepsDone;
  if (o.logging.breakdown) synchronizeDevice(device);
  p.marks->mark();
  if (measureMemory()) mem.peakBackward = endMemoryPhase();
  par.syncTiedEmbeddings();
  // The loss's average over data-parallel ranks is queued before the update. After it, under FSDP
  // with gatherAfterStep, it would queue on the shard group's stream behind the next forward's
  // leading all-gathers, and its wait would hold the compute stream until they finished.
  auto l = loss.reshape({1}).to(at::kFloat).clone();
  if (!ctx.settings.faultInject.empty() &&  // tests: TESSERA_FAULT_INJECT=nan-loss-at-step-N:R
      ctx.settings.faultInject == fmt::format("nan-loss-at-step-{}:{}", s + 1, ctx.world->rank())) {
    l.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  const auto& data = par.mesh->dataGroup();
  if (data->size() > 1) data->allReduce(l, ReduceOp::Avg)->wait();
  std::vector<CommPtr> sumOver{par.mesh->tpGroup(), par.mesh->ppGroup()};
  if (auto g = dp.normGroup()) sumOver.insert(sumOver.begin(), g);
  p.rep.lr = optim::lrAt(o.optim.lr, s);
  // Clipping's coefficient goes to AdamW, which scales the gradients as it reads them (one pass
  // over them less); the norm is read back with the loss, after the update is queued.
  const auto clip = globalGradNorm(dp.gradPieces(o.parallel.tp), sumOver, o.optim.clip, device);
  // 1 where this rank's loss or the (global) gradient norm is not finite; the world's maximum is
  // read back with the step's values (--nan-policy stop) or, to skip the update, before it.
  auto nonFinite =
      (at::logical_not(at::isfinite(l)) | at::logical_not(at::isfinite(clip.norm.reshape({1})))).to(at::kFloat);
  if (saver) saver->beforeUpdate();  // a save's host copies read the parameters: update after them
  update(p, nonFinite, clip);
  afterUpdateMoe(p);
  p.marks->mark();
  if (o.precision.fp8 != fp8::Recipe::Off) {                          // validation's casts are counted in the next step
    auto sums = kernels::takeFp8CountsOn(device, fp8::takeCounts());  // the GPU casts' and the CPU emulation's
    ctx.world->allReduce(sums, ReduceOp::Sum)->wait();
    p.fp8.queue(sums);
  }
  if (measureMemory()) mem.peakOptimizer = endMemoryPhase();
  const double runPeak = measureMemory() ? runPeakGiB : peakMemoryGiB(device);
  auto peak = at::cat({toDevice({static_cast<float>(runPeak), static_cast<float>(mem.stepStart),
                                 static_cast<float>(mem.beforeBackward), static_cast<float>(mem.peakForward),
                                 static_cast<float>(mem.peakBackward), static_cast<float>(mem.peakOptimizer)},
                                device),
                       nonFinite});
  ctx.world->allReduce(peak, ReduceOp::Max)->wait();  // the fullest rank's; any rank's non-finite flag
  p.values.queue(at::cat({l, clip.norm.reshape({1}).to(at::kFloat), peak}));
  p.marks->mark();  // the step's end: its last kernel queued
  return p;
}

void Trainer::State::update(Pending& p, const at::Tensor& nonFinite, const GradNormClip& clip) {
  if (o.optim.nanPolicy == NanPolicy::SkipStep) {
    auto any = nonFinite.clone();
    ctx.world->allReduce(any, ReduceOp::Max)->wait();
    p.rep.skipped = any.item<float>() > 0;  // a host wait each step: the price of skipping
  }
  skippedInARow = p.rep.skipped ? skippedInARow + 1 : 0;
  if (!p.rep.skipped) {
    par.dp->step(p.rep.lr, o.optim.clip > 0 ? clip.coef : at::Tensor());
    return;
  }
  par.dp->skipStep();
  if (isLogger()) {
    log::warn(
        "train_gpt: step {}: the loss or the gradient norm is not finite: update skipped (--nan-policy "
        "skip-step; {} in a row)",
        p.rep.step, skippedInARow);
  }
  if (skippedInARow >= kMaxSkippedInARow) {
    throw NonFiniteError(
        fmt::format("train_gpt: step {}: {} steps in a row had a non-finite loss or gradient norm and were skipped "
                    "(--nan-policy skip-step): the run stops without saving; {}. Lower --lr (now {:.3g}) or --clip",
                    p.rep.step, skippedInARow, keptCheckpoint(), o.optim.lr.lr));
  }
}

StepReport Trainer::State::finishStep(Pending& p) {
  StepReport rep = p.rep;
  const auto h = p.values.get();
  const float* v = h.data_ptr<float>();
  rep.loss = v[0], rep.gradNorm = v[1], rep.peakMemGiB = v[2];
  rep.memStepStartGiB = v[3], rep.memBeforeBackwardGiB = v[4], rep.memPeakForwardGiB = v[5];
  rep.memPeakBackwardGiB = v[6], rep.memPeakOptimizerGiB = v[7];
  rep.nonFinite = v[8] > 0;
  if (p.fp8.queued()) {
    const auto c = p.fp8.get();
    const int64_t* n = c.data_ptr<int64_t>();
    rep.fp8Values = n[0], rep.fp8Underflows = n[1], rep.fp8Saturated = n[2];
  }
  readMoeStats(p, rep);
  rep.pipelineMs = p.marks->ms(0, 1);
  rep.optimizerMs = p.marks->ms(1, 2);
  // On the device's clock: from the previous step's end when the device went on from it to this
  // step, else from this step's start (the first step, or one after validation or a checkpoint).
  // A step reported at once (the last one, say) is timed as one reported a step late.
  rep.stepMs = previousEnd ? p.marks->msFrom(*previousEnd, 3, 3) : p.marks->ms(0, 3);
  previousEnd = p.marks;

  rep.bubbleMsEst = rep.pipelineMs * bubbleShare;
  // Host clocks time a backward only when it blocks: always on the CPU, with --breakdown on GPUs.
  if (!backwardMs.empty() && (!device.is_cuda() || o.logging.breakdown)) {
    double mean = 0;
    for (double b : backwardMs) mean += b;
    mean /= static_cast<double>(backwardMs.size());
    rep.dpSyncMsEst = std::max(0.0, lastBackwardMs - mean);
  }
  rep.computeMsEst = rep.pipelineMs - rep.bubbleMsEst - std::max(0.0, rep.dpSyncMsEst);
  const double tokens = static_cast<double>(o.optim.batch * o.model.cfg.seqLen);
  rep.tokensPerS = tokens / (rep.stepMs / 1e3);
  if (o.logging.peakTflops > 0) {
    rep.mfu = rep.tokensPerS * models::flopsPerToken(o.model.cfg) / (ctx.world->size() * o.logging.peakTflops * 1e12);
  }
  return rep;
}

}  // namespace tessera::train
