#pragma once
// Measures a Calibration (plan/calibration.h) on this process's device (cuda:0 when a GPU is
// visible, else the CPU): the linears' three GEMMs at the shapes the given models take under each
// tp degree and token count (bf16, and FP8 where the build has the kernels), causal attention at
// each sequence length, the fused elementwise kernels, AdamW, all through the runtime's own ops
// (nn/, kernels/, optim/). Each figure is the mean of repeated runs after warm-ups, the device
// synchronised around them. Local; takes seconds to minutes; `progress` receives one line per group.
// Errors: a shape the device cannot hold → tessera::Error naming it.
#include <functional>
#include <string>
#include <vector>

#include "tessera/models/config.h"
#include "tessera/plan/calibration.h"

namespace tessera::plan {

struct MeasureOptions {
  std::vector<models::ModelConfig> models;
  std::vector<int> tp = {1, 2, 4, 8};
  std::vector<int64_t> tokens = {2048, 8192, 32768};  // rows of the GEMMs (micro-batch · seq / cp)
  std::vector<int64_t> seqs = {1024, 2048, 4096, 8192};
  // Context parallel's attention as rank 0 of a cp group plays it (its two query chunks against the
  // gathered keys, through a communicator that moves no data), per model at tp 1 (CUDA only).
  std::vector<int> cp = {2, 4};
  std::vector<int64_t> cpSeqs = {8192, 32768, 131072};
  double maxGemmGflop = 4e4;  // skip larger GEMMs (FLOPs scale from the smaller ones)
  bool fp8 = true;            // also FP8 GEMMs (CUDA builds only)
  std::function<void(const std::string&)> progress;
};

Calibration measureCalibration(const MeasureOptions& o);

}  // namespace tessera::plan
