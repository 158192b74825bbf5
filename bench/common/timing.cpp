// Shared benchmark method; see timing.h.
#include "timing.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "comm/fake/fake_timing.h"
#include "comm/settings.h"
#include "common/profiler.h"
#include "fake_world.h"

namespace tessera::bench {

int64_t envInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : dflt;
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
  return std::stoi(part.substr(prefix.size()));
}

GptConfig gptConfigFromEnv() {
  GptConfig c;
  c.d = envInt("D", 2048);
  c.layers = envInt("L", 12);
  c.heads = std::max<int64_t>(1, c.d / 128);
  c.vocab = envInt("V", 32000);
  c.seqLen = envInt("T", 1024);
  return c;
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
                              bool profile) {
  std::vector<double> times;
  // TESSERA_PROFILE=PATH[:FIRST[:COUNT]] traces chosen steps (warm-ups count; a traced step's time
  // includes the profiler's cost, so a profiled run's timing is not a result).
  const int rank = static_cast<int>(envInt("RANK", 0));
  const auto env = profile ? Settings::fromEnvironment() : Settings{};
  StepProfiler profiler(rank, env.profile, env.profileCpu);
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

std::string resultLine(const GptConfig& cfg, const BenchResult& r) {
  const double med = median(r.times);
  const double tps = r.tokensPerStep / med;
  const double mfu = tps * gptFlopsPerToken(cfg) / (r.world * 989e12);
  std::string all;
  for (double t : r.times) all += fmt::format("{}{:.2f}", all.empty() ? "" : ", ", t * 1e3);
  // The FAKE_WORLD probe (fake_world.h): its own rows, never mistaken for a real run's.
  const int fake = fakeWorldSize();
  // Timed (FAKE_COMM_TIMED): "-emulated", the model's parameters in "fake_comm".
  const FakeTiming timing = fakeTimingFromEnv();
  std::string system = r.system;
  if (fake) system += !timing.enabled ? "-nocomm" : timing.ignoreByCaller ? "-emulated-keepdone" : "-emulated";
  const std::string extra = fake ? fmt::format("\"fake_world\": {}, \"fake_comm\": \"{}\", {}", fake,
                                               timing.describe(), r.extra)
                                 : r.extra;
  return fmt::format(
      "RESULT {{\"system\": \"{}\", \"mode\": \"{}\", \"world\": {}, \"params_M\": {:.1f}, \"step_ms\": {:.2f}, "
      "\"tokens_per_s\": {:.0f}, \"mfu_vs_989\": {:.3f}, \"peak_mem_GiB\": {:.2f}, {}\"step_ms_all\": [{}]}}",
      system, r.mode, r.world, gptParamCount(cfg) / 1e6, med * 1e3, tps, mfu, r.peakGiB,
      extra.empty() ? "" : extra + ", ", all);
}

}  // namespace tessera::bench
