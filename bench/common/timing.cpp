// Shared benchmark method; see timing.h.
#include "timing.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tessera/comm/settings.h"
#include "common/env.h"
#include "tessera/common/error.h"
#include "tessera/common/profiler.h"

namespace tessera::bench {

int64_t envInt(const char* name, int64_t dflt) {
  const auto v = env::get(name);
  return v && !v->empty() ? *env::getInt(name) : dflt;
}

std::vector<std::string> splitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (size_t pos = 0;;) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) return out;
    pos = next + 1;
  }
}

std::optional<int> numberedPart(const std::string& part, const std::string& prefix) {
  if (part.size() <= prefix.size() || part.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const auto digits = part.substr(prefix.size());
  TESSERA_CHECK(digits.find_first_not_of("0123456789") == std::string::npos && digits.size() < 9,
                "'{}': expected {} followed by a count", part, prefix);
  return std::stoi(digits);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string jsonNumber(double v) { return std::isfinite(v) ? fmt::format("{:.6f}", v) : "null"; }

at::Device singleProcessDevice() {
  if (!torch::cuda::is_available()) return at::kCPU;
  return {at::kCUDA, static_cast<c10::DeviceIndex>(envInt("LOCAL_RANK", 0))};
}

void synchronize(const at::Device& d) { synchronizeDevice(d); }

std::vector<double> timeSteps(int warm, int steps, const at::Device& d, const std::function<void()>& fn,
                              int profileRank) {
  std::vector<double> times;
  // TESSERA_PROFILE=PATH[:FIRST[:COUNT]] traces chosen steps (warm-ups count; a traced step's time
  // includes the profiler's cost, so a profiled run's timing is not a result).
  const auto env = profileRank >= 0 ? Settings::fromEnvironment() : Settings{};
  StepProfiler profiler(std::max(profileRank, 0), env.profile, env.profileCpu);  // no path: off
  for (int i = 0; i < warm + steps; ++i) {
    synchronize(d);
    profiler.beginStep(i);
    auto t0 = std::chrono::steady_clock::now();
    fn();
    synchronize(d);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    profiler.endStep(i);
    if (i >= warm) times.push_back(s);
  }
  return times;
}

std::string resultLine(const models::ModelConfig& cfg, const BenchResult& r, const FakeWorld& fake) {
  const double med = median(r.times);
  const double tps = r.tokensPerStep / med;
  const double mfu = tps * models::flopsPerToken(cfg) / (r.world * 989e12);
  std::string all;
  for (double t : r.times) all += fmt::format("{}{:.2f}", all.empty() ? "" : ", ", t * 1e3);
  // The fake world's rows are marked, never mistaken for a real run's.
  const std::string extra = fake.size ? fmt::format("\"fake_world\": {}, \"fake_comm\": \"{}\", {}", fake.size,
                                                    fake.timing.describe(), r.extra)
                                      : r.extra;
  const int64_t params = models::paramCount(cfg);
  return fmt::format(
      "RESULT {{\"system\": \"{}\", \"mode\": \"{}\", \"gpus\": {}, \"params\": {}, \"params_M\": {:.1f}, "
      "\"step_ms\": {:.2f}, \"tokens_per_s\": {:.0f}, \"mfu\": {:.3f}, \"peak_mem_gib\": {:.2f}, {}\"step_ms_all\": [{}]}}",
      r.system + fake.systemSuffix(), r.mode, r.world, params, params / 1e6, med * 1e3, tps, mfu, r.peakGiB,
      extra.empty() ? "" : extra + ", ", all);
}

}  // namespace tessera::bench
