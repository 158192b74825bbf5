#pragma once
// tessera-plan's search: every layout of a workload over a cluster's GPUs (dp × tp × pp × cp with
// tp inside a node, DDP / FSDP / HSDP, micro-batch sizes, schedules and virtual stages), each either
// refused with its reason or predicted (plan/predict.h), the best first by tokens/s per GPU. Local;
// pure; a few thousand layouts take well under a second.
#include <string>
#include <vector>

#include "tessera/plan/predict.h"

namespace tessera::plan {

struct SearchOptions {
  std::vector<RecomputeMode> recompute = {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full};
  std::vector<int64_t> microBatchSizes = {1, 2, 4};
  int maxCp = 8;
  bool allowHsdp = true;
};

struct Planned {
  Workload work;
  Layout layout;
  Prediction prediction;
};

struct Refused {
  Workload work;
  Layout layout;
  std::string reason;
};

struct SearchResult {
  std::vector<Planned> ranked;  // fitting layouts, fastest first
  std::vector<Refused> refused;
};

SearchResult search(const Workload& w, const Cluster& c, const Calibration& cal, const SearchOptions& o = {});

}  // namespace tessera::plan
