#pragma once
// What every benchmark binary shares: the anchors' method and the result line.
// - Configuration from the environment as ../shared/anchors/torch_anchor.py reads it, at the top
//   of each driver's main (D, L, V, T: bench_model.h; B and STEPS read by each binary).
// - Timing: WARM=3 warm-up steps, then the median (sorted[n/2], as the anchor) of STEPS
//   steps, each between two synchronisations of the device (none on the CPU).
// - Peak memory: the caching allocator's peak of allocated bytes since resetPeakMemory()
//   (on the CPU: the process's peak resident set, src/common/device.h).
// - One line on rank 0: RESULT {json} with bench/results.py's row keys (system, mode, gpus,
//   params, params_M, step_ms, tokens_per_s, mfu, peak_mem_gib) plus step_ms_all and extra
//   members; bench/results.py reads these lines. Under the TESSERA_FAKE_WORLD probe
//   (fake_world.h) the system gets its suffix ("-nocomm", "-emulated") and the line "fake_world": N.
// Local to one process; not thread-safe.
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/common/device.h"
#include "fake_world.h"
#include "tessera/models/config.h"

namespace tessera::bench {

constexpr int kWarmSteps = 3;

// An integer variable (unset or empty: dflt); a malformed value is a tessera::Error naming it.
int64_t envInt(const char* name, int64_t dflt);
// "a,b,c" → {"a", "b", "c"} (split at every `sep`; an empty string gives {""}).
std::vector<std::string> splitList(const std::string& s, char sep);
// A variant's numbered part: "carve16" with prefix "carve" → 16; no such prefix → nullopt.
std::optional<int> numberedPart(const std::string& part, const std::string& prefix);
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
// durations (s). With profileRank >= 0, TESSERA_PROFILE (common/profiler.h) traces chosen steps,
// the rank naming the file; -1: never (a helper measurement of a run that traces its training steps).
std::vector<double> timeSteps(int warm, int steps, const at::Device& d, const std::function<void()>& fn,
                              int profileRank);

struct BenchResult {
  std::string system, mode;
  int world = 1;
  double tokensPerStep = 0;    // tokens one step trains (over all ranks)
  std::vector<double> times;   // seconds of the timed steps
  double peakGiB = 0;
  std::string extra;           // more JSON members, "\"k\": v, ..." (may be empty)
};
// The RESULT line (MFU over world GPUs at 989 TFLOP/s, FLOPs per token as models::flopsPerToken;
// params: models::paramCount). A fake world's run gets its system suffix and "fake_world",
// "fake_comm" (the timing model) members.
std::string resultLine(const models::ModelConfig& cfg, const BenchResult& r, const FakeWorld& fake = {});

}  // namespace tessera::bench
