#pragma once
// FP8 codes of the weights once per step (design.md's "Per step, not per micro-batch"). While an
// Fp8WeightCacheScope is open, fp8ParallelLinear (fp8_linear.h) casts each weight once: its codes,
// and for tensorwise their transpose for backward's input-gradient GEMM. Every later forward and
// backward of the step reuses them instead of casting (and all-reducing the amax) again: the other
// micro-batches, a pipeline's backwards, ZB-H1's deferred weight gradients. The codes are the same
// values the casts would give, so results do not change.
//
// Cost: the kept codes, 2 bytes per weight element (tensorwise), while the scope is open. The
// trainer therefore opens it where weights stay resident (DDP, pipelines), not under FSDP, whose
// gathered weights it would keep alive.
// Weights must not change while a scope is open (the trainer closes it before the optimizer). An
// entry holds its weight tensor and is keyed by the tensor and its version: an in-place change
// misses instead of returning stale codes, and a freed tensor's address is never reused while the
// entry exists.
// Process-wide, not per thread: autograd runs CUDA backwards on its own device thread. One scope at
// a time (opening a second is a tessera::Error); a scope constructed with `on` false does nothing.
#include <ATen/core/Tensor.h>

#include <optional>

#include "kernels/fp8.h"

namespace tessera::tp {

class Fp8WeightCacheScope {
 public:
  explicit Fp8WeightCacheScope(bool on = true);
  ~Fp8WeightCacheScope();
  Fp8WeightCacheScope(const Fp8WeightCacheScope&) = delete;
  Fp8WeightCacheScope& operator=(const Fp8WeightCacheScope&) = delete;
  // Lookups answered from the cache since the last scope opened (for tests).
  static int64_t hits();

 private:
  bool on_;
};

namespace detail {
// What a weight's codes serve: tensorwise (codes and transpose, one amax), rowwise forward (per
// output feature), rowwise input gradient (per input feature, transposed).
enum class WeightUse { Tensorwise, RowsForward, ColsBackward };
bool weightCacheOpen();
std::optional<kernels::Fp8Codes> cachedWeight(const at::Tensor& weight, WeightUse use);
void keepWeight(const at::Tensor& weight, WeightUse use, const kernels::Fp8Codes& codes);  // no-op when closed
}  // namespace detail

}  // namespace tessera::tp
