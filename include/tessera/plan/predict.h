#pragma once
// The cost model: how long one optimizer step of a workload takes in a layout on a cluster, and
// how much memory its fullest rank needs, from a calibration of the card. Compute is summed per op
// (the blocks' GEMMs at their sharded shapes, attention, the elementwise kernels, recompute, FP8
// casts, the head and loss, AdamW); communication is timed from the links' bus bandwidth and
// exposed by the rules the runtime applies (DDP's buckets behind backward, FSDP's prefetch one unit
// ahead, TP + SP's gathers and reduce-scatters in the critical path, CP's K/V gathers, pipeline
// stages simulated from their schedule tables with parallel/pipeline/simulate.h). What it leaves
// out and how well it matches measured runs: docs/design/plan.md. Local; pure functions.
// Errors: an invalid layout → tessera::Error with refusal()'s reason; a mixture-of-experts model →
// tessera::Error naming its experts (not costed yet), from every function here and from search().
#include <string>
#include <vector>

#include "tessera/plan/layout.h"

namespace tessera::plan {

struct Prediction {
  double stepMs = 0;
  double computeMs = 0;      // the busiest rank's kernels, recompute included
  double exposedCommMs = 0;  // communication not hidden behind compute
  double bubbleMs = 0;       // pipeline idle time on the busiest rank
  double optimizerMs = 0;
  double tokensPerSPerGpu = 0, mfu = 0;
  double memoryGiB = 0;  // the fullest rank's peak
  double paramsGiB = 0, optimizerStateGiB = 0, activationsGiB = 0, buffersGiB = 0;
  double hiddenCommMs = 0;  // communication beside compute (costs overlapSlowdown of it)
  // Per micro-batch on the busiest pp rank: "forward", "backward", "weight grads", "tp/cp comm",
  // and per step "dp comm exposed", "weight casts".
  std::vector<std::pair<std::string, double>> parts;
};

// Empty when the layout can run this workload on this cluster, else why not (divisibility, a
// combination the runtime refuses, a peak over 92 % of the GPU's memory).
std::string refusal(const Workload& w, const Layout& l, const Cluster& c, const Calibration& cal);
Prediction predict(const Workload& w, const Layout& l, const Cluster& c, const Calibration& cal);
// Peak memory of the fullest rank alone (no refusal for memory).
Prediction predictMemory(const Workload& w, const Layout& l, const Cluster& c);

}  // namespace tessera::plan
