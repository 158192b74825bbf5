#pragma once
// Fp8WeightCacheScope: FP8 codes of the weights once per step. While a scope is open,
// fp8ParallelLinear (fp8_linear.h) casts each weight once (its codes, and for tensorwise their
// transpose) and every later forward and backward of the step reuses them: the same values, so
// results do not change. Costs 2 bytes per weight element (tensorwise) while open: not for FSDP.
// Weights must not change while a scope is open (close it before the optimizer); an in-place
// change misses (entries are keyed by tensor and version) rather than returning stale codes.
// Process-wide, not per thread (CUDA backward runs on autograd's device thread). One scope at a
// time (a second is a tessera::Error); a scope constructed with `on` false does nothing.
// Why: docs/design/tensor_parallel.md.
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
