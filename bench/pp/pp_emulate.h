#pragma once
// PP_EMULATE=P: the pipeline benchmark on ONE device, for when P GPUs are not at hand. The
// model's units (embedding, each block, head + loss) run one after another for every
// micro-batch, each on its own detached input as a stage boundary would have it, and every
// unit's forward, backward and optimizer step is timed with device events (DeviceTimer; 3 warm-up
// steps, then the mean over STEPS). Those costs, summed per stage, go through
// pipeline::simulateStep (src/pipeline/simulate.h) for every candidate partition (the compute- and
// parameter-balanced ones, and for P = 2 every other split of the blocks) and extra warm-up
// (EXTRA_WARMUPS, default "0 1 2 3"): the predicted step is the simulated schedule plus the
// slowest rank's optimizer step, transfers modelled as fake_timing.h's point-to-point
// (latency + bytes / bus bandwidth; its defaults, or FAKE_COMM_BUSBW_GBPS / FAKE_COMM_LATENCY_US
// together with FAKE_COMM_TIMED=1, which is what makes fakeTimingFromEnv read them).
// Rows (RESULT lines, system "...-emulated", world = P): the partition the 2-GPU benchmark uses
// (compute-balanced) at extra warm-up 0 and at EXTRA_WARMUP, and the best predicted combination.
// A table of every combination goes to stdout. Peak memory is not predicted (0 in the rows).
// What it leaves out: whatever simulate.h leaves out (host overhead across two processes,
// transfers competing with compute for SMs and memory bandwidth).
#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "gpt.h"
#include "pipeline/schedule.h"

namespace tessera::bench {

struct PipelineUnits {
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  Fn embed;                                 // tokens -> hidden
  std::vector<Fn> blocks;                   // hidden -> hidden
  Fn head;                                  // hidden -> logits
  std::vector<std::vector<at::Tensor>> params;  // per unit: embed, blocks..., head
  std::vector<int64_t> blockParams;
  int64_t embedParams = 0, headParams = 0;
};

// Runs the probe and prints the rows; returns the process exit status.
int emulatePipeline(const GptConfig& cfg, PipelineUnits& units, const at::Device& device, int64_t batch, int micro,
                    int steps, int pp, pipeline::ScheduleKind kind, int extraWarmup);

}  // namespace tessera::bench
