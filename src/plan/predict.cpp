// The step-time model: stages, pipeline simulation, data-parallel communication, optimizer
// (contract in plan/predict.h).
#include "tessera/plan/predict.h"

#include <algorithm>
#include <cmath>

#include "plan/costs.h"
#include "plan/shapes.h"
#include "plan/stages.h"
#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/simulate.h"

namespace tessera::plan {

void requireCostable(const Workload& w) {
  TESSERA_CHECK(w.model.moe.experts == 0,
                "plan: the model has {} experts (top {}): the cost model does not cost mixture-of-experts layers or "
                "expert parallelism yet, and a dense model's answer would be wrong; choose --layout and --ep by hand "
                "(docs/design/plan.md)",
                w.model.moe.experts, w.model.moe.topK);
}

std::string refusal(const Workload& w, const Layout& l, const Cluster& c, const Calibration& cal) {
  requireCostable(w);
  const auto& m = w.model;
  if (l.gpus() != c.gpus) return fmt::format("dp·tp·pp·cp = {}, not the cluster's {} GPUs", l.gpus(), c.gpus);
  if (!tpFits(m, l.tp)) {
    return fmt::format("tp {} does not divide the heads ({}), kv heads ({}) and MLP width ({})", l.tp, m.heads, m.kvH(),
                       m.ffnSize());
  }
  if (m.vocab % l.tp != 0) return fmt::format("tp {} does not divide the vocabulary ({})", l.tp, m.vocab);
  if (l.tp > 1 && l.sp && (w.seqLen / l.cp) % l.tp != 0) {
    return fmt::format("sequence parallel: seq / cp = {} is not divisible by tp {}", w.seqLen / l.cp, l.tp);
  }
  if (l.tp > c.gpusPerNode) return fmt::format("tp {} spans nodes of {} GPUs", l.tp, c.gpusPerNode);
  if (w.seqLen % (2 * l.cp) != 0) return fmt::format("seq {} is not divisible by 2·cp = {}", w.seqLen, 2 * l.cp);
  if (l.dp * l.microBatch * l.microBatches != w.globalBatch) {
    return fmt::format("dp {} × micro-batch {} × {} micro-batches ≠ the global batch {}", l.dp, l.microBatch,
                       l.microBatches, w.globalBatch);
  }
  if (m.layers < static_cast<int64_t>(l.pp) * l.chunks) {
    return fmt::format("{} layers cannot fill pp {} × {} virtual stages", m.layers, l.pp, l.chunks);
  }
  if (l.pp > 1) {
    try {
      scheduleFor(l);
    } catch (const Error& e) {
      return e.what();
    }
    const bool zb =
        l.schedule == pipeline::ScheduleKind::ZeroBubbleH1 || l.schedule == pipeline::ScheduleKind::ZeroBubbleV;
    const bool inter = l.schedule == pipeline::ScheduleKind::Interleaved1F1B;
    if (inter && l.sharding != Sharding::Ddp && dataRanks(l) > 1) return "FSDP is refused with interleaved";
    if (zb && l.sharding != Sharding::Ddp && dataRanks(l) > 1) return "FSDP is refused with ZB-H1 and ZB-V";
  }
  if ((l.keepGathered || l.shardedAccumulation) && l.sharding == Sharding::Ddp) {
    return "keep-gathered and sharded accumulation need FSDP";
  }
  const double need = predictMemory(w, l, c).memoryGiB;
  if (need > 0.92 * c.memoryGiB) return fmt::format("needs {:.1f} GiB per GPU of {:.0f}", need, c.memoryGiB);
  (void)cal;
  return {};
}

namespace {

struct DpCost {
  double exposed = 0, hidden = 0;
};

// Data-parallel communication of one rank holding `params` (per tp shard) whose last micro-batch's
// backward takes `window` ms and whose forward per micro-batch `fwd` ms.
DpCost dataParallel(const Layout& l, const Cluster& c, const Collectives& comm, double params, double window,
                    double fwd, int units) {
  DpCost d;
  const int ranks = dataRanks(l);
  if (ranks <= 1) return d;
  const int span = spanDp(l);
  if (l.sharding == Sharding::Ddp) {
    const double bytes = params * 4, cap = 25.0 * (1 << 20);  // DdpOptions::bucketCapBytes
    const double bucket = comm.ms("all_reduce", std::min(bytes, cap), ranks, span);
    const double total = std::ceil(bytes / cap) * bucket;
    d.exposed = std::max(bucket, total - window);
    d.hidden = total - d.exposed;
    return d;
  }
  const int shard = shardGroup(l, c);
  const int shardSpan = l.sharding == Sharding::Hsdp ? shard * l.pp * l.cp * l.tp : span;
  const double ag = comm.ms("all_gather", params * 2, shard, shardSpan);
  const double rs = comm.ms("reduce_scatter", params * 4, shard, shardSpan);
  const double m = static_cast<double>(l.microBatches);
  const double gathers = l.keepGathered ? 1 : 2 * m;
  const double scatters = l.shardedAccumulation ? m : 1;  // else once a step, after the local sums
  // Prefetch hides a gather behind the previous unit's compute: the first unit's waits, and what
  // the compute cannot cover. A backward that reduce-scatters shares its window between the gathers
  // and the reduce-scatters; the others (local accumulation) only gather.
  const double fwdExposed = ag / units + std::max(0.0, ag - fwd);
  const double bwdGather = l.keepGathered ? 0 : ag;
  const double bwdScattering = rs / units + std::max(0.0, bwdGather + rs - window);
  const double bwdGathering = std::max(0.0, bwdGather - window);
  d.exposed = (l.keepGathered ? fwdExposed : m * fwdExposed) + scatters * bwdScattering + (m - scatters) * bwdGathering;
  d.hidden = std::max(0.0, gathers * ag + scatters * rs - d.exposed);
  if (l.sharding == Sharding::Hsdp && ranks > shard) {  // replicas all-reduce their shards
    const double ar = comm.ms("all_reduce", params * 4 / shard, ranks / shard, span);
    d.exposed += ar;
  }
  return d;
}

}  // namespace

SimulatedPipeline simulatePipeline(const Layout& l, const std::vector<pipeline::StageCost>& sim, double transfer) {
  // Once the pipeline has filled, each round of `cap` further micro-batches adds the same time:
  // simulate cap and 2·cap of them and extend that slope to the rest (the whole table when short).
  const int64_t cap = 4 * static_cast<int64_t>(l.pp) * l.chunks;
  auto busiest = [](const pipeline::SimulatedStep& r) { return *std::max_element(r.busy.begin(), r.busy.end()); };
  if (l.microBatches <= 3 * cap) {
    const auto r = pipeline::simulateStep(scheduleFor(l)->table, sim, transfer);
    return {r.step, busiest(r)};
  }
  Layout a = l, b = l;
  a.microBatches = cap, b.microBatches = 2 * cap;
  const auto ra = pipeline::simulateStep(scheduleFor(a)->table, sim, transfer);
  const auto rb = pipeline::simulateStep(scheduleFor(b)->table, sim, transfer);
  const double rounds = static_cast<double>(l.microBatches - 2 * cap) / static_cast<double>(cap);
  return {rb.step + rounds * (rb.step - ra.step), busiest(rb) + rounds * (busiest(rb) - busiest(ra))};
}

Prediction predict(const Workload& w, const Layout& l, const Cluster& c, const Calibration& cal) {
  const std::string why = refusal(w, l, c, cal);
  TESSERA_CHECK(why.empty(), "plan: layout {} refused: {}", describe(l), why);
  Prediction p = predictMemory(w, l, c);
  const Collectives comm{c};
  const Stages st = stagesOf(w, l);
  const PassCost block = blockCost(w, l, cal, comm), head = headCost(w, l, cal, comm), emb = embeddingCost(w, l, cal);
  std::vector<PassCost> stage(st.part.numStages());
  std::vector<pipeline::StageCost> sim;
  for (int s = 0; s < st.part.numStages(); ++s) {
    stage[s] = block.scaled(st.blocks(s));
    if (st.first(s)) stage[s] += emb;
    if (st.last(s)) stage[s] += head;
    sim.push_back({stage[s].fwd + stage[s].fwdComm, stage[s].bwd + stage[s].bwdComm, stage[s].wgrad});
  }
  const int64_t micro = l.microBatches;
  double pipeMs = 0, busy = 0;
  if (l.pp == 1 && l.chunks == 1) {
    busy = sim[0].forward + sim[0].backward + sim[0].weight;
    pipeMs = micro * busy;
    busy = pipeMs;
  } else {
    const double bytes = static_cast<double>(tokensPerMicro(w, l)) * w.model.d * 2 / (l.sp && l.tp > 1 ? l.tp : 1);
    const SimulatedPipeline r = simulatePipeline(l, sim, comm.ms("send_recv", bytes, 2, spanPp(l)));
    pipeMs = r.step;
    busy = r.busy;
  }
  double exposed = 0, hidden = 0, optimizer = 0, casts = 0, tpCp = 0;
  for (int r = 0; r < l.pp; ++r) {
    double params = 0, window = 0, fwd = 0, inner = 0;
    int units = 0;
    for (int s : st.ofRank[r]) {
      inner += micro * (stage[s].fwdComm + stage[s].bwdComm);
      params += stageParams(w, l, st.blocks(s), st.first(s), st.last(s));
      window += stage[s].bwd + stage[s].wgrad;
      fwd += stage[s].fwd;
      units += st.blocks(s) + (st.first(s) ? 1 : 0) + (st.last(s) ? 1 : 0);
    }
    const DpCost d = dataParallel(l, c, comm, params, window, fwd, units);
    exposed = std::max(exposed, d.exposed + inner);
    tpCp = std::max(tpCp, inner);
    hidden = std::max(hidden, d.hidden);
    const double own = l.sharding != Sharding::Ddp && dataRanks(l) > 1 ? params / shardGroup(l, c) : params;
    optimizer = std::max(optimizer, own * cal.adamwNsPerParam * 1e-6);
    const bool cached = l.sharding == Sharding::Ddp || dataRanks(l) == 1 || l.keepGathered;
    if (w.fp8) casts = std::max(casts, cal.elementMs("cast", params) * (cached ? 1 : static_cast<double>(micro)));
  }
  const PassCost& s0 = stage[st.ofRank[0][0]];
  p.parts = {{"forward (stage 0, per micro-batch)", s0.fwd},
             {"backward", s0.bwd},
             {"weight grads", s0.wgrad},
             {"tp/cp comm", s0.fwdComm + s0.bwdComm},
             {"dp comm exposed (step)", exposed - tpCp},
             {"dp comm hidden (step)", hidden},
             {"weight casts (step)", casts}};
  p.hiddenCommMs = hidden;
  p.computeMs = busy - tpCp;  // the simulated stages carry their tp and cp communication
  p.bubbleMs = pipeMs - busy;
  p.exposedCommMs = exposed;
  p.optimizerMs = optimizer;
  p.stepMs = pipeMs + exposed - tpCp + optimizer + casts + cal.overlapSlowdown * hidden;
  const double tokens = static_cast<double>(w.globalBatch) * w.seqLen;
  p.tokensPerSPerGpu = tokens / (p.stepMs / 1000) / c.gpus;
  p.mfu = models::flopsPerToken(w.model) * p.tokensPerSPerGpu / (cal.peakTflopsBf16 * 1e12);
  return p;
}

}  // namespace tessera::plan
