#include "tessera/common/profiler.h"

#include <torch/version.h>

#include <set>

#include "tessera/common/error.h"
#include "tessera/common/log.h"

#if TORCH_VERSION_MAJOR >= 2 && defined(TESSERA_TORCH_CUDA)
#include <torch/csrc/autograd/profiler_kineto.h>
#define TESSERA_KINETO 1
#endif

namespace tessera {

StepProfiler::StepProfiler(int rank, const std::string& spec, bool cpuOps) : cpuOps_(cpuOps) {
  if (spec.empty()) return;
  auto c1 = spec.find(':');
  path_ = spec.substr(0, c1);
  try {
    if (c1 != std::string::npos) {
      auto c2 = spec.find(':', c1 + 1);
      first_ = std::stoll(spec.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1));
      if (c2 != std::string::npos) count_ = std::stoll(spec.substr(c2 + 1));
    }
  } catch (const std::exception&) {
    throw Error(fmt::format("TESSERA_PROFILE='{}': expected PATH[:FIRST[:COUNT]] with integer FIRST and COUNT", spec));
  }
  TESSERA_CHECK(!path_.empty() && first_ >= 0 && count_ > 0,
                "TESSERA_PROFILE='{}': expected PATH[:FIRST[:COUNT]], FIRST >= 0, COUNT > 0", spec);
  if (rank != 0) {
    auto dot = path_.rfind('.');
    auto slash = path_.rfind('/');
    auto cut = dot != std::string::npos && (slash == std::string::npos || dot > slash) ? dot : path_.size();
    path_ = fmt::format("{}.rank{}{}", path_.substr(0, cut), rank, path_.substr(cut));
  }
#ifndef TESSERA_KINETO
  log::warn("TESSERA_PROFILE is set, but this tessera has no Kineto profiler (needs LibTorch 2.x with CUDA): "
            "nothing is traced");
  path_.clear();
#endif
}

void StepProfiler::beginStep(int64_t step) {
#ifdef TESSERA_KINETO
  if (path_.empty() || active_ || step != first_) return;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  // Without cpuOps: CUDA activity only, no CPU op records (which slow the host and so
  // lengthen the gaps a host-bound step leaves on the GPU).
  std::set<ActivityType> activities{ActivityType::CUDA};
  if (cpuOps_) activities.insert(ActivityType::CPU);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  active_ = true;
#else
  (void)step;
#endif
}

void StepProfiler::endStep(int64_t step) {
#ifdef TESSERA_KINETO
  if (!active_ || step != first_ + count_ - 1) return;
  auto result = torch::autograd::profiler::disableProfiler();
  active_ = false;
  result->save(path_);
  log::info("TESSERA_PROFILE: steps {}..{} traced to {}", first_, step, path_);
#else
  (void)step;
#endif
}

}  // namespace tessera
