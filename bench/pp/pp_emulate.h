#pragma once
// tessera_bench_pp --emulate P: the pipeline benchmark on ONE device, for when P GPUs are not at
// hand. The benchmarks' model (bench_model.h, one stage holding it all) is cut into units
// (embedding, each block, final LayerNorm + head + loss), which run one after another for every
// micro-batch, each on its own detached input as a stage boundary would have it, and every unit's
// forward, backward (B, then the weight-gradient GEMMs its linears defer, W: the costs a
// zero-bubble schedule places apart; the others pay B + W) and optimizer step is timed with device
// events (DeviceTimer; 3 warm-up steps, then the mean over STEPS). Those costs, summed per stage,
// go through pipeline::simulateStep (src/parallel/pipeline/simulate.h) for every candidate partition (the
// compute- and parameter-balanced ones, and for P = 2 every other split of the blocks) and extra
// warm-up (extraWarmups): the predicted step is the simulated schedule plus the slowest rank's
// optimizer step, transfers priced as fake_timing.h's point-to-point under `transfer` (latency +
// bytes / bus bandwidth).
// Rows (RESULT lines, system "...-emulated", world = P): the partition the 2-GPU benchmark uses
// (compute-balanced) at extra warm-up 0 and at EXTRA_WARMUP, and the best predicted combination.
// A table of every combination goes to stdout. Peak memory is not predicted (0 in the rows).
// What it leaves out: whatever simulate.h leaves out (host overhead across two processes,
// transfers competing with compute for SMs and memory bandwidth).
#include <ATen/ATen.h>

#include <vector>

#include "comm/fake/fake_timing.h"
#include "tessera/models/config.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::bench {

struct PipelineEmulation {
  int pp = 2;  // the stages predicted (>= 2)
  pipeline::ScheduleKind kind = pipeline::ScheduleKind::OneFOneB;
  int extraWarmup = 0;               // the benchmark's own (a row of its own)
  std::vector<int> extraWarmups;     // the extra warm-ups predicted (1F1B)
  FakeTiming transfer;               // prices the activations' point-to-point transfers
};

// Runs the probe on `device` (batch in `micro` micro-batches, kWarmSteps then `steps` steps;
// fusedWgrad as tessera_bench_pp's FUSED_WGRAD) and prints the rows; returns the exit status.
int emulatePipeline(const models::ModelConfig& cfg, const at::Device& device, int64_t batch, int micro, int steps,
                    bool fusedWgrad, const PipelineEmulation& e);

}  // namespace tessera::bench
