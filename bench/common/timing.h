#pragma once
// What every benchmark binary shares: the anchors' method and the result line.
// - Configuration from the environment as ../shared/anchors/torch_anchor.py reads it
//   (D, L, V, T; heads of 128; B and STEPS read by each binary).
// - Timing: WARM=3 warm-up steps, then the median (sorted[n/2], as the anchor) of STEPS
//   steps, each between two synchronisations of the device (none on the CPU).
// - Peak memory: the caching allocator's peak of allocated bytes since resetPeakMemory()
//   (on the CPU: the process's peak resident set, src/common/device.h).
// - One line on rank 0: RESULT {json} with the anchor's keys (mode, world, params_M, step_ms,
//   tokens_per_s, mfu_vs_989, peak_mem_GiB) plus system, step_ms_all and extra members;
//   the combiners (bench/*/combine.py, bench/combine_parallel.py) read these lines. Under the
//   FAKE_WORLD probe (fake_world.h) the system gets "-nocomm" and the line "fake_world": N.
// Local to one process; not thread-safe.
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/device.h"
#include "gpt.h"

namespace tessera::bench {

constexpr int kWarmSteps = 3;

int64_t envInt(const char* name, int64_t dflt);
// "a,b,c" → {"a", "b", "c"} (split at every `sep`; an empty string gives {""}).
std::vector<std::string> splitList(const std::string& s, char sep);
// A variant's numbered part: "carve16" with prefix "carve" → 16; no such prefix → nullopt.
std::optional<int> numberedPart(const std::string& part, const std::string& prefix);
GptConfig gptConfigFromEnv();
double median(std::vector<double> v);
// A number for a RESULT line: fixed with 6 decimals, or null when it is not finite (JSON has no NaN:
// a diverged loss would otherwise make the whole line unreadable to the combiners).
std::string jsonNumber(double v);

// The device a single-process run uses: CUDA LOCAL_RANK where LibTorch has CUDA devices, else CPU.
at::Device singleProcessDevice();
// Device helpers (src/common/device.h).
using tessera::peakMemoryGiB;
using tessera::resetPeakMemory;
using tessera::useDevice;
void synchronize(const at::Device& d);
// Runs fn warm + steps times, the device synchronised around each; returns the last `steps`
// durations (s). TESSERA_PROFILE (common/profiler.h) traces chosen steps, RANK naming the file;
// profile = false: never (a helper measurement of a run that traces its training steps).
std::vector<double> timeSteps(int warm, int steps, const at::Device& d, const std::function<void()>& fn,
                              bool profile = true);

struct BenchResult {
  std::string system, mode;
  int world = 1;
  double tokensPerStep = 0;    // tokens one step trains (over all ranks)
  std::vector<double> times;   // seconds of the timed steps
  double peakGiB = 0;
  std::string extra;           // more JSON members, "\"k\": v, ..." (may be empty)
};
// The RESULT line (MFU over world GPUs at 989 TFLOP/s, FLOPs per token as gptFlopsPerToken).
std::string resultLine(const GptConfig& cfg, const BenchResult& r);

}  // namespace tessera::bench
