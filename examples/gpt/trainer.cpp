// train_gpt's 3D training loop: one step and the run (see trainer.h); the setup is trainer_build.cpp's.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <optional>

#include "common/autocast.h"
#include "common/device.h"
#include "common/error.h"
#include "common/host_sync.h"
#include "common/profiler.h"
#include "kernels/fp8.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "parallel/grad_norm.h"
#include "pipeline/schedule.h"
#include "trainer_state.h"

namespace tessera::gpt {

namespace {
// `v` on `device` without a host synchronization: from pinned memory, the copy queued.
at::Tensor toDevice(const std::vector<float>& v, const at::Device& device) {
  auto host = at::tensor(v);
  return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
}
}  // namespace

bool Trainer::State::deferReports() const { return device.is_cuda() && !o.breakdown; }

Trainer::State::Pending Trainer::State::queueStep(int64_t s) {
  Pending p{StepReport{}, StreamMarks(device), {}, {}, Clock::now()};
  p.rep.step = s + 1;
  // The run's first step learns shapes and builds buckets (host round trips); the later ones are checked.
  SyncCheck checked(device, s > startStep ? o.syncDebug : SyncDebug::Off);
  auto batch = batches->next(s);
  backwardMs.clear();
  lastBackwardMs = 0;
  if (o.breakdown) synchronizeDevice(device);
  mem = {};
  if (measureMemory()) {
    endMemoryPhase();  // the last step's tail (logging, validation, checkpoints) is in no phase's peak
    mem.stepStart = allocatedMemoryGiB(device);
  }
  p.marks.mark();
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
  if (o.breakdown) synchronizeDevice(device);
  p.marks.mark();
  if (measureMemory()) mem.peakBackward = endMemoryPhase();
  syncTiedEmbeddings();
  // The loss's average over data-parallel ranks is queued before the update. After it, under FSDP
  // with gatherAfterStep, it would queue on the shard group's stream behind the next forward's
  // leading all-gathers, and its wait would hold the compute stream until they finished (1.7 ms a
  // step on llama3-1b, 4 x H100: bench/results/scale_traces_llama3_1b_h100.md).
  auto l = loss.reshape({1}).to(at::kFloat).clone();
  if (mesh->dataGroup()->size() > 1) mesh->dataGroup()->allReduce(l, ReduceOp::Avg)->wait();
  std::vector<CommPtr> sumOver{mesh->tpGroup(), mesh->ppGroup()};
  if (fsdp) sumOver.insert(sumOver.begin(), mesh->dataGroup());
  p.rep.lr = optim::lrAt(o.lr, s);
  // Clipping's coefficient goes to AdamW, which scales the gradients as it reads them (one pass
  // over them less); the norm is read back with the loss, after the update is queued.
  const auto clip = globalGradNorm(gradPieces(), sumOver, o.clip, device);
  const auto scale = o.clip > 0 ? clip.coef : at::Tensor();
  if (saver) saver->beforeUpdate();  // a save's host copies read the parameters: update after them
  if (fsdp) {
    shardedAdam->options().lr = p.rep.lr;
    shardedAdam->step(scale);
    shardedAdam->zeroGrad();
  } else {
    adam->setLr(p.rep.lr);
    adam->step(scale);
    ddp->zeroGrad();
    if (s == startStep) logDdpBuckets();
  }
  p.marks.mark();
  if (o.fp8 != fp8::Recipe::Off) {  // validation's casts are counted in the next step
    auto sums = kernels::takeFp8CountsOn(device, fp8::takeCounts());  // the GPU casts' and the CPU emulation's
    ctx.world->allReduce(sums, ReduceOp::Sum)->wait();
    p.fp8.queue(sums);
  }
  if (measureMemory()) mem.peakOptimizer = endMemoryPhase();
  const double runPeak = measureMemory() ? runPeakGiB : peakMemoryGiB(device);
  auto peak = toDevice({static_cast<float>(runPeak), static_cast<float>(mem.stepStart),
                        static_cast<float>(mem.beforeBackward), static_cast<float>(mem.peakForward),
                        static_cast<float>(mem.peakBackward), static_cast<float>(mem.peakOptimizer)},
                       device);
  ctx.world->allReduce(peak, ReduceOp::Max)->wait();  // the fullest rank's
  p.values.queue(at::cat({l, clip.norm.reshape({1}).to(at::kFloat), peak}));
  return p;
}

StepReport Trainer::State::finishStep(Pending& p) {
  StepReport rep = p.rep;
  const auto h = p.values.get();
  const float* v = h.data_ptr<float>();
  rep.loss = v[0], rep.gradNorm = v[1], rep.peakMemGiB = v[2];
  rep.memStepStartGiB = v[3], rep.memBeforeBackwardGiB = v[4], rep.memPeakForwardGiB = v[5];
  rep.memPeakBackwardGiB = v[6], rep.memPeakOptimizerGiB = v[7];
  if (p.fp8.queued()) {
    const auto c = p.fp8.get();
    const int64_t* n = c.data_ptr<int64_t>();
    rep.fp8Values = n[0], rep.fp8Underflows = n[1], rep.fp8Saturated = n[2];
  }
  rep.pipelineMs = p.marks.ms(0, 1);
  rep.optimizerMs = p.marks.ms(1, 2);
  // From the previous step's end when the device went on from it to this step, else from the
  // host's start of this one (the first step, or one after validation or a checkpoint).
  const auto now = Clock::now();
  const auto from = lastFinished && *lastFinished > p.queued ? *lastFinished : p.queued;
  rep.stepMs = std::chrono::duration<double, std::milli>(now - from).count();
  lastFinished = now;

  const int v2 = o.chunks, m = o.microBatches, pp = o.pp;
  rep.bubbleMsEst = rep.pipelineMs * (pp - 1) / static_cast<double>(v2 * m + pp - 1);
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
  return rep;
}

std::vector<StepReport> Trainer::run() {
  auto& s = *s_;
  s.loadCheckpoint();
  s.openLog();
  s.startTrainingMemory();
  std::vector<StepReport> out;
  StepProfiler profiler(s.ctx.world->rank(), s.o.profile, s.o.profileCpu);
  // GPUs: a step is reported once the next is queued, so the host never waits for the device
  // inside a step; steps followed by validation, a save or an export are reported at once.
  std::optional<State::Pending> pending;
  auto report = [&](State::Pending& p, bool eval) {
    out.push_back(s.finishStep(p));
    if (eval) out.back().validLoss = s.validationLoss();
    s.logStep(out.back());
  };
  for (int64_t i = s.startStep; i < s.o.steps; ++i) {
    profiler.beginStep(i);
    auto p = s.queueStep(i);
    if (profiler.endsAt(i)) synchronizeDevice(s.device);  // the trace holds the step's kernels
    profiler.endStep(i);
    if (pending) report(*pending, false);
    pending.reset();
    const bool eval = s.o.evalEvery > 0 && ((i + 1) % s.o.evalEvery == 0 || i + 1 == s.o.steps);
    const bool every = s.o.checkpointEvery > 0 && (i + 1) % s.o.checkpointEvery == 0;
    const bool save = !s.o.checkpointDir.empty() && (every || i + 1 == s.o.steps);
    const bool hf = s.o.saveHfEvery > 0 && (i + 1) % s.o.saveHfEvery == 0;
    if (!s.deferReports() || eval || save || hf || !s.ctx.settings.faultInject.empty()) {
      report(p, eval);
    } else {
      pending.emplace(std::move(p));
    }
    if (save) s.saveCheckpoint(i + 1);
    if (hf) s.saveHf(fmt::format("{}/step-{}", s.o.saveHfDir, i + 1));
    if (s.saver) s.saver->poll();  // a failed save ends the run here, not at the next save
    injectFault(s.ctx.settings, fmt::format("kill-after-step-{}", i + 1), s.ctx.world->rank(), "train_gpt");
  }
  if (pending) report(*pending, false);
  if (!s.o.saveHfAtEnd.empty()) s.saveHf(s.o.saveHfAtEnd);
  if (s.saver) s.saver->wait();  // the last checkpoint is published before the run ends
  return out;
}

}  // namespace tessera::gpt
