#pragma once
// Predicts how long a schedule table (schedule.h) takes on real devices, from what each stage's
// computations cost, by replaying the tables as PipelineExecutor (executor.h) runs them:
// - each rank has a compute stream and one communication stream (NCCL's), in table order;
// - a Comm batch starts on the communication stream once the compute stream has reached the
//   point where the batch was posted (NCCL's ops wait on the caller's stream) and the previous
//   batch has finished; it finishes `transfer` after it and every peer batch holding a
//   counterpart of its ops (the k-th send a→b meets the k-th receive b←a) have started;
// - a forward waits for the batch that brought its input, a backward for the one that brought
//   its output gradient (not for sends), a weight-gradient pass (W) for nothing but its rank;
// - the step ends when every rank's computations and batches have finished.
// What it leaves out: host overhead, the contention of transfers with compute for SMs and
// memory bandwidth, and costs that differ between micro-batches. It is for choosing a schedule
// or partition and bounding what one can reach (tessera_bench_pp --emulate), not a measurement.
// Pure: no device, no communication.
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline {

// One micro-batch, any time unit. `weight`: the part of the backward that computes weight
// gradients and can be deferred (W); `backward`: the rest (B). A schedule that does not split
// backward pays backward + weight in its Backward action; ZB-H1 pays them in B and W.
struct StageCost {
  double forward = 0, backward = 0, weight = 0;
};

struct SimulatedStep {
  double step = 0;                // the makespan
  std::vector<double> busy;       // per rank: time spent computing
  std::vector<double> idle;       // per rank: step − busy
};

// `costs[s]`: virtual stage s (schedule.numStages() entries, stage = chunk · pp + rank).
// Throws tessera::Error naming the numbers when costs has the wrong size or a negative entry,
// or when the tables cannot finish (a send without its receive; never for makeSchedule's).
SimulatedStep simulateStep(const Schedule& s, const std::vector<StageCost>& costs, double transfer = 0);

}  // namespace tessera::pipeline
