#pragma once
// Kineto traces of chosen steps of a training loop, for finding where a step's GPU time goes.
//
//   spec PATH[:FIRST[:COUNT]]   trace steps FIRST .. FIRST+COUNT-1 (defaults 3 and 2); the
//                               programs take it from TESSERA_PROFILE (Settings::profile)
//   cpuOps false                CUDA kernels and runtime calls only, no CPU ops (less host
//                               overhead, so truer gaps on the GPU; TESSERA_PROFILE_CPU=0)
//
// beginStep(s) starts LibTorch's Kineto profiler (CPU ops
// and CUDA kernels) at step FIRST, endStep(s) stops it after the last traced step and writes a
// Chrome trace (chrome://tracing, Perfetto; bench/profile/summarize.py tabulates its kernels) to
// PATH, or to PATH with ".rank<r>" before the extension on ranks other than 0.
// Local to one process; call both from the thread that runs the steps. Needs LibTorch 2.x with
// CUDA; elsewhere a spec is reported once (log::warn) and nothing is traced. Empty: no cost.
// A malformed spec is a tessera::Error naming it.
#include <cstdint>
#include <string>

namespace tessera {

class StepProfiler {
 public:
  // `spec`: PATH[:FIRST[:COUNT]]; empty: nothing traced.
  StepProfiler(int rank, const std::string& spec, bool cpuOps = true);
  void beginStep(int64_t step);
  void endStep(int64_t step);
  bool enabled() const { return !path_.empty(); }
  bool endsAt(int64_t step) const { return enabled() && step == first_ + count_ - 1; }  // the last traced step

 private:
  std::string path_;
  int64_t first_ = 3, count_ = 2;
  bool cpuOps_ = true;
  bool active_ = false;
};

}  // namespace tessera
