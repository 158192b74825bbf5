// train_gpt --layout auto (contract in auto_layout.h).
#include "tessera/train/auto_layout.h"

#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/plan/search.h"

namespace tessera::train {

namespace {

plan::RecomputeMode toPlan(nn::Recompute r) {
  return r == nn::Recompute::None   ? plan::RecomputeMode::None
         : r == nn::Recompute::Full ? plan::RecomputeMode::Full
                                    : plan::RecomputeMode::Selective;
}

nn::Recompute fromPlan(plan::RecomputeMode r) {
  return r == plan::RecomputeMode::None   ? nn::Recompute::None
         : r == plan::RecomputeMode::Full ? nn::Recompute::Full
                                          : nn::Recompute::Selective;
}

void apply(const plan::Planned& best, Config& o) {
  const plan::Layout& l = best.layout;
  auto& p = o.parallel;
  p.dp = l.dp, p.pp = l.pp, p.cp = l.cp, p.tp = l.tp;
  p.dpMode = l.sharding == plan::Sharding::Ddp ? DpMode::Ddp : DpMode::Fsdp;
  p.sequenceParallel = l.tp > 1 && l.sp;
  p.microBatches = static_cast<int>(l.microBatches);
  p.schedule = l.schedule;
  p.chunks = l.chunks;
  if (p.dpMode == DpMode::Fsdp) {
    p.fsdpKeepGathered = l.keepGathered ? OnOffAuto::On : OnOffAuto::Off;
    if (l.microBatches > 1) p.fsdpAccumulate = l.shardedAccumulation ? FsdpAccumulate::Sharded : FsdpAccumulate::Local;
  }
  o.precision.recompute = fromPlan(best.work.recompute);
}

}  // namespace

void chooseLayout(Config& o, const Context& ctx) {
  const int world = ctx.world->size();
  TESSERA_CHECK(!o.parallel.planCalibration.empty(),
                "train_gpt: --layout auto needs --plan-calibration FILE (bench/plan/calibration.json of a checkout, "
                "or one written by tessera-plan calibrate on this machine's GPU)");
  TESSERA_CHECK(o.optim.batch > 0, "train_gpt: --layout auto needs --batch (the global batch it plans for)");
  const plan::Calibration cal = plan::loadCalibration(o.parallel.planCalibration, deviceName(ctx.device));
  plan::Workload w;
  w.model = o.model.cfg;
  w.seqLen = o.model.cfg.seqLen;
  w.globalBatch = o.optim.batch;
  w.fp8 = o.precision.fp8 != fp8::Recipe::Off;
  w.recompute = toPlan(o.precision.recompute);
  plan::Cluster c;
  c.gpus = world;
  c.gpusPerNode = std::max(1, ctx.launch.localWorldSize);
  c.memoryGiB = ctx.device.is_cuda() ? totalMemoryGiB(ctx.device) : cal.memoryGiB > 0 ? cal.memoryGiB : 64;
  c.intra = cal.intraNode;
  c.inter = plan::assumedInterNodeLink();
  plan::SearchOptions so;
  so.allowHsdp = false;  // train_gpt shards over the whole data group
  const plan::SearchResult r = plan::search(w, c, cal, so);
  TESSERA_CHECK(!r.ranked.empty(), "train_gpt: --layout auto: no layout of {} ranks fits ({} refused; first: {})",
                world, r.refused.size(), r.refused.empty() ? "none" : r.refused.front().reason);
  const plan::Planned& best = r.ranked.front();
  apply(best, o);
  o.parallel.autoLayout = false;
  if (ctx.world->rank() == 0) {
    log::info(
        "train_gpt: --layout auto: {} with {} recompute, predicted {:.0f} ms a step, {:.0f} tokens/s per GPU, "
        "{:.1f} GiB (tessera-plan, {} costs of {}; {} layouts predicted, {} refused)",
        plan::describe(best.layout), plan::toString(best.work.recompute), best.prediction.stepMs,
        best.prediction.tokensPerSPerGpu, best.prediction.memoryGiB, cal.card, cal.date, r.ranked.size(),
        r.refused.size());
  }
}

}  // namespace tessera::train
