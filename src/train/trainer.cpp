// The Trainer: construction, the configured run (fit) and the calls a custom loop makes; one step
// is trainer_step.cpp's.
#include <fmt/format.h>

#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/common/profiler.h"
#include "tessera/parallel/pipeline/simulate.h"
#include "tessera/train/auto_layout.h"
#include "train/trainer_state.h"

namespace tessera::train {

Trainer::State::State(Config c, const Context& context) : o(std::move(c)), ctx(context), device(context.device) {
  if (o.parallel.autoLayout) chooseLayout(o, ctx);
  o.resolve(ctx.world->size());
  if (o.timeoutS > 0) {  // --timeout: the world's ops and the groups split from it below
    ctx.settings.timeout = std::chrono::seconds(o.timeoutS);
    ctx.world->setTimeout(ctx.settings.timeout);
  }
  ParallelizeHooks hooks;
  if (!o.checkpoint.initFromHf.empty()) hooks.onModel = [this](std::vector<models::LmChunk>& m) { initFromHf(m); };
  hooks.beforeBackward = [this](int, int, bool) {
    if (o.logging.breakdown) synchronizeDevice(device);
    if (measureMemory() && mem.beforeBackward < 0) {  // the step's first backward ends its forward phase
      mem.beforeBackward = allocatedMemoryGiB(device);
      mem.peakForward = endMemoryPhase();
    }
    backwardStart = Clock::now();
  };
  hooks.afterBackward = [this](int, int, bool last) {
    if (o.logging.breakdown) synchronizeDevice(device);
    (last ? lastBackwardMs : (backwardMs.emplace_back(), backwardMs.back())) = msSince(backwardStart);
  };
  par = parallelize(o, ctx, hooks);
  {  // The table's idle time on this pp rank over its step, every (virtual) stage's F, B and W one unit
     // each: (pp − 1) / (M + pp − 1) for 1F1B, the zero-bubble tables' own share.
    const auto& s = par.pipeline->schedule();
    const auto sim = pipeline::simulateStep(s, std::vector<pipeline::StageCost>(s.numStages(), {1, 1, 1}));
    bubbleShare = sim.step > 0 ? sim.idle.at(par.mesh->coord().pp) / sim.step : 0;
  }
  if (!o.checkpoint.dir.empty() && o.checkpoint.async) {
    saver = std::make_unique<checkpoint::AsyncSaver>(ctx.world, ctx.store, ctx.settings.timeout);
  }
  const auto me = par.mesh->coord();
  batches = std::make_unique<Batches>(o, me.dp, device, me.cp);
}

Trainer::Trainer(Config config, const Context& ctx) : s_(std::make_unique<State>(std::move(config), ctx)) {}
Trainer::~Trainer() = default;

int64_t Trainer::stepsDone() const { return s_->stepsDone; }
const Config& Trainer::config() const { return s_->o; }

bool Trainer::restore() {
  s_->previousEnd.reset();
  return s_->loadCheckpoint();
}

StepReport Trainer::step() {
  auto& s = *s_;
  if (!s.batches->started()) s.batches->start(nullptr, s.stepsDone);
  return step(s.batches->next(s.stepsDone));
}

StepReport Trainer::step(const data::TokenBatch& batch) {
  auto p = s_->queueStep(batch);
  auto r = s_->finishStep(p);
  s_->stopIfNonFinite(r);
  return r;
}

void Trainer::log(const StepReport& report) {
  if (!s_->logOpened) s_->openLog();
  s_->logStep(report);
}

double Trainer::evaluate() {
  s_->previousEnd.reset();
  return s_->validationLoss();
}

void Trainer::save() {
  s_->previousEnd.reset();
  s_->saveCheckpoint();
}

void Trainer::exportHf(const std::string& dir) {
  s_->previousEnd.reset();
  s_->saveHf(dir);
}

std::vector<StepReport> Trainer::fit(const std::function<void(const StepReport&)>& onStep) {
  auto& s = *s_;
  const auto& o = s.o;
  restore();  // starts the data too: at the checkpoint's position, or the beginning
  if (s.stepsDone >= o.optim.steps) {
    if (s.isLogger()) {
      log::warn(
          "train_gpt: nothing to train: the checkpoint in {} is at step {} and --steps is {} (a larger --steps "
          "goes on from it)",
          s.resumedFrom, s.stepsDone, o.optim.steps);
    }
    return {};
  }
  s.openLog();
  s.startTrainingMemory();
  std::vector<StepReport> out;
  StepProfiler profiler(s.ctx.world->rank(), o.logging.profile, o.logging.profileCpu);
  // GPUs: a step is reported once the next is queued, so the host never waits for the device
  // inside a step; steps followed by validation, a save or an export are reported at once.
  std::optional<State::Pending> pending;
  auto report = [&](State::Pending& p, bool eval) {
    out.push_back(s.finishStep(p));
    if (eval && !out.back().nonFinite) out.back().validLoss = evaluate();
    log(out.back());
    s.stopIfNonFinite(out.back());  // before any save: NaN weights never replace a checkpoint
    if (onStep) onStep(out.back());
  };
  for (int64_t i = s.stepsDone; i < o.optim.steps; ++i) {
    profiler.beginStep(i);
    auto p = s.queueStep(s.batches->next(i));
    if (profiler.endsAt(i)) synchronizeDevice(s.device);  // the trace holds the step's kernels
    profiler.endStep(i);
    if (pending) report(*pending, false);
    pending.reset();
    const bool eval = o.data.evalEvery > 0 && ((i + 1) % o.data.evalEvery == 0 || i + 1 == o.optim.steps);
    const bool every = o.checkpoint.every > 0 && (i + 1) % o.checkpoint.every == 0;
    const bool save = !o.checkpoint.dir.empty() && (every || i + 1 == o.optim.steps);
    const bool hf = o.checkpoint.saveHfEvery > 0 && (i + 1) % o.checkpoint.saveHfEvery == 0;
    if (!s.deferReports() || eval || save || hf || !s.ctx.settings.faultInject.empty()) {
      report(p, eval);
    } else {
      pending.emplace(std::move(p));
    }
    if (save) this->save();
    if (hf) exportHf(fmt::format("{}/step-{}", o.checkpoint.saveHfDir, i + 1));
    if (s.saver) s.saver->poll();  // a failed save ends the run here, not at the next save
    injectFault(s.ctx.settings, fmt::format("kill-after-step-{}", i + 1), s.ctx.world->rank(), "train_gpt");
  }
  if (pending) report(*pending, false);
  if (!o.checkpoint.saveHfAtEnd.empty()) exportHf(o.checkpoint.saveHfAtEnd);
  if (s.saver) s.saver->wait();  // the last checkpoint is published before the run ends
  s.logSummary(out);
  return out;
}

void Trainer::State::stopIfNonFinite(const StepReport& r) const {
  if (!r.nonFinite || o.optim.nanPolicy != NanPolicy::Stop) return;
  throw NonFiniteError(fmt::format(
      "train_gpt: step {}: the loss is {:.6g} and the gradient norm {:.6g}: not finite, so the run stops (--nan-policy "
      "stop) without saving; {}. Lower --lr (now {:.3g}) or --clip, or give --nan-policy skip-step to skip such steps",
      r.step, r.loss, r.gradNorm, keptCheckpoint(), o.optim.lr.lr));
}

std::string Trainer::State::keptCheckpoint() const {
  return lastCheckpoint.empty() ? "no checkpoint was written"
                                : fmt::format("the last checkpoint, {}, is kept as it was", lastCheckpoint);
}

double Trainer::State::validationLoss() {
  for (auto& c : par.chunks) c->eval();
  auto sum = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (int k = 0; k < o.data.evalBatches; ++k) {
    auto b = batches->validBatch(k);
    sum +=
        par.pipeline->evaluate(par.firstStage() ? b.tokens : at::Tensor(), par.lastStage() ? b.targets : at::Tensor());
  }
  for (auto& c : par.chunks) c->train();
  par.dp->endForwardOnly();
  const auto& data = par.mesh->dataGroup();
  if (data->size() > 1) data->allReduce(sum, ReduceOp::Avg)->wait();
  return sum.item<double>() / o.data.evalBatches;
}

}  // namespace tessera::train
