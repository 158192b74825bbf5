// train_gpt's 3D training loop: one step and the run (see trainer.h); the setup is trainer_build.cpp's.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>

#include "common/autocast.h"
#include "common/device.h"
#include "common/error.h"
#include "common/profiler.h"
#include "kernels/fp8.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "parallel/grad_norm.h"
#include "pipeline/schedule.h"
#include "trainer_state.h"

namespace tessera::gpt {

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
  s.startTrainingMemory();
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
