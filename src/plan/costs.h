#pragma once
// Internal to the cost model (plan/predict.h): the pieces predict.cpp composes. Times in ms, per
// micro-batch on one rank unless said otherwise. Local; pure.
#include <algorithm>

#include "tessera/parallel/pipeline/simulate.h"
#include "tessera/plan/predict.h"

namespace tessera::plan {

// One micro-batch through something on one rank: forward, backward without weight gradients (B;
// recompute included), weight gradients (W), and the communication in each pass: `exposed` on the
// critical path, `hidden` running beside compute (it slows that compute by overlapSlowdown).
struct PassCost {
  double fwd = 0, bwd = 0, wgrad = 0;
  double fwdComm = 0, bwdComm = 0, hiddenComm = 0;
  PassCost& operator+=(const PassCost& o);
  PassCost scaled(double k) const;
};

// Throws tessera::Error naming the model when the cost model cannot cost it: a mixture-of-experts
// model (its routed experts, their grouped GEMMs and expert parallelism's exchanges are not costed
// yet; a dense answer would be silently wrong).
void requireCostable(const Workload& w);

struct Collectives {
  const Cluster& cluster;
  // ms of one collective of `bytes` (all-gather / reduce-scatter: the gathered size; all-reduce:
  // the buffer; send_recv: the message) over `n` ranks whose group spans `span` consecutive ranks
  // of the mesh (a group within one node runs over the intra-node link).
  double ms(const char* op, double bytes, int n, int span) const;
};

// Ranks a group of each kind spans in the mesh (tp fastest, then cp, pp, dp).
inline int spanTp(const Layout& l) { return l.tp; }
inline int spanCp(const Layout& l) { return l.cp * l.tp; }
inline int spanPp(const Layout& l) { return l.pp * l.cp * l.tp; }
inline int spanDp(const Layout& l) { return l.gpus(); }

// The mesh's data group: gradients are averaged over dp × cp, FSDP shards over it.
inline int dataRanks(const Layout& l) { return l.dp * l.cp; }
// The ranks FSDP shards over: the data group; HSDP: its ranks inside one node.
inline int shardGroup(const Layout& l, const Cluster& c) {
  if (l.sharding != Sharding::Hsdp) return dataRanks(l);
  return std::max(1, std::min(dataRanks(l), c.gpusPerNode / (l.pp * l.tp)));
}

int64_t tokensPerMicro(const Workload& w, const Layout& l);  // micro-batch · seq / cp
PassCost blockCost(const Workload& w, const Layout& l, const Calibration& cal, const Collectives& comm);
PassCost headCost(const Workload& w, const Layout& l, const Calibration& cal, const Collectives& comm);
PassCost embeddingCost(const Workload& w, const Layout& l, const Calibration& cal);

struct SimulatedPipeline {
  double step = 0, busy = 0;  // the makespan; the busiest rank's compute
};
// The step of the layout's schedule over these per-stage costs (pipeline/simulate.h); past 12·pp·chunks
// micro-batches, simulated at 4·pp·chunks and twice that and extended along that slope.
SimulatedPipeline simulatePipeline(const Layout& l, const std::vector<pipeline::StageCost>& sim, double transfer);

// Parameters this rank holds unsharded by data parallelism, for the stage holding `blocks` blocks
// (with the embedding and/or head when first/last), under tp.
double stageParams(const Workload& w, const Layout& l, int blocks, bool first, bool last);

}  // namespace tessera::plan
