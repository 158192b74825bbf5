#pragma once
// The routed experts' SwiGLU (models/moe.h), local: rows [M, d] grouped by expert (counts[e] rows
// for expert e, in expert order) → y [M, d], y = (silu(x w1[e]ᵀ) · x w3[e]ᵀ) w2[e]ᵀ for each group.
// Two ways, the same maths: grouped GEMMs (compat::groupedMm: three for all experts, group ends =
// a cumulative sum of the counts on the device, so the host reads nothing; backward is grouped
// GEMMs too) on CUDA devices of compute capability 9.0+ with LibTorch 2.8+, when the operands are
// bfloat16 after CUDA autocast's casts, d and f are multiples of 8 and the data 16-byte aligned;
// else a loop of at::linear over the experts with rows, which reads the counts on the host (the
// CPU, LibTorch 1.13, float32). Where a CUDA run falls back to the loop, one log line per process
// and reason says why. TESSERA_MOE_GROUPED_GEMM=0 forces the loop (measurements).
// Errors: tessera::Error naming the shapes when rows, counts and weights disagree, or the reason
// when Grouped is asked for and cannot run.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::models::moe_detail {

enum class ExpertGemm { Auto, Loop, Grouped };  // Auto: grouped where it can run, unless the variable says 0

// FP8 forwards for the experts (fp8GroupedLinear): `on`, and the tensors that key each weight's codes
// in the step's FP8 weight cache: the parameters themselves, since the w1, w3, w2 handed to
// runExperts may be new tensors every forward (autocast's copy of a scaled or region view) and would
// add a cache entry each time. An undefined key: that weight is cast every forward, not cached.
struct ExpertFp8 {
  bool on = false;
  at::Tensor key1, key3, key2;
};

// rows [M, d]; counts [El] integer (any device; the sum must be M); w1, w3 [El, f, d]; w2 [El, d, f].
// fp8.on: the three forward GEMMs in FP8 where the grouped path runs and d and f are multiples of 16;
// elsewhere bf16, one log line per process saying why.
at::Tensor runExperts(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& w1, const at::Tensor& w3,
                      const at::Tensor& w2, ExpertGemm how = ExpertGemm::Auto, const ExpertFp8& fp8 = {});

// The same with the counts on the host (expert parallel knows them there).
at::Tensor runExperts(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& w1,
                      const at::Tensor& w3, const at::Tensor& w2, ExpertGemm how = ExpertGemm::Auto,
                      const ExpertFp8& fp8 = {});

// y [M, out] = x · w[g]ᵀ for the rows of group g, the forward GEMM in FP8: x and w cast to E4M3 with
// one scale per row of x and per output feature of each expert (the only scaling the grouped kernel
// takes, whatever the --fp8 recipe), at::_scaled_grouped_mm with fast accumulation (as the dense
// FP8 linears' forward); w's codes come from the step's FP8 weight cache when one is open, keyed by
// `key` (w's parameter; undefined: not cached). Backward is the bf16 grouped path's (input and weight gradients in bf16
// grouped GEMMs): FP8 input gradients ran at half the bf16 rate at OLMoE's shape on an H200 (without fast
// accumulation), and the weight gradient's FP8 kernel needs every group's rows a multiple of 16. x bf16 [M, in], w bf16
// [El, out, in], offs int32 [El] (row ends) on x's device. CUDA sm_90 with LibTorch 2.8+ only.
at::Tensor fp8GroupedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                            const at::Tensor& key = {});

// An integer tensor's values on the host as int64 (a device-to-host copy for a CUDA tensor).
std::vector<int64_t> hostCounts(const at::Tensor& t);

}  // namespace tessera::models::moe_detail
