#pragma once
// The one place where LibTorch 1.13 (Debian, CPU) and 2.x (PyTorch wheels, CUDA) differ for
// tessera. Keep version conditionals here.
#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <string>

#include "tessera/common/error.h"

namespace tessera::compat {

inline c10d::TCPStoreOptions tcpStoreOptions(uint16_t port, bool isServer, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = isServer;
  o.numWorkers = c10::nullopt;
  o.waitWorkers = false;
  o.timeout = timeout;
  return o;
}

// at::_grouped_mm (PyTorch 2.8+, differentiable; CUTLASS grouped GEMM for bf16 on sm_90/sm_100,
// elsewhere a loop that reads the offsets on the host): a [M, K] with rows grouped, b [G, K, N],
// offs [G] int32 on a's device, the groups' cumulative row ends → [M, N] in a's dtype.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
inline constexpr bool kHaveGroupedMm = true;
inline at::Tensor groupedMm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  return at::_grouped_mm(a, b, offs);
}
#else
inline constexpr bool kHaveGroupedMm = false;
inline at::Tensor groupedMm(const at::Tensor& a, const at::Tensor& b, const at::Tensor&) {
  throw Error(fmt::format("grouped GEMM of [{}] by [{}]: LibTorch {}.{} has no at::_grouped_mm (2.8+)",
                          fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "), TORCH_VERSION_MAJOR,
                          TORCH_VERSION_MINOR));
}
#endif

// at::_scaled_grouped_mm (PyTorch 2.8+; CUTLASS, sm_90): y [M, N] (outDtype) = (a ⊙ aScaleInv) ·
// (b[g] ⊙ bScaleInv[g])ᵀ for the rows of group g: a uint8 E4M3 codes [M, K] with one float32
// dequantisation factor per row [M], b uint8 E4M3 codes [G, N, K] with one per output feature
// [G, N], offs [G] int32 (the groups' row ends, on a's device). The kernel takes rowwise scales only.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
inline constexpr bool kHaveScaledGroupedMm = true;
inline at::Tensor scaledGroupedMm(const at::Tensor& a, const at::Tensor& aScaleInv, const at::Tensor& b,
                                  const at::Tensor& bScaleInv, const at::Tensor& offs, at::ScalarType outDtype,
                                  bool fastAccum) {
  return at::_scaled_grouped_mm(a.view(at::kFloat8_e4m3fn), b.view(at::kFloat8_e4m3fn).transpose(1, 2), aScaleInv,
                                bScaleInv, offs, /*bias=*/c10::nullopt, /*scale_result=*/c10::nullopt, outDtype,
                                fastAccum);
}
// uint8 E4M3 codes decoded to float32 by LibTorch's own float8 type (tests' references).
inline at::Tensor e4m3ToFloat(const at::Tensor& codes) { return codes.view(at::kFloat8_e4m3fn).to(at::kFloat); }
#else
inline constexpr bool kHaveScaledGroupedMm = false;
inline at::Tensor scaledGroupedMm(const at::Tensor& a, const at::Tensor&, const at::Tensor& b, const at::Tensor&,
                                  const at::Tensor&, at::ScalarType, bool) {
  throw Error(fmt::format("FP8 grouped GEMM of [{}] by [{}]: LibTorch {}.{} has no at::_scaled_grouped_mm (2.8+)",
                          fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "), TORCH_VERSION_MAJOR,
                          TORCH_VERSION_MINOR));
}
inline at::Tensor e4m3ToFloat(const at::Tensor& codes) {
  throw Error(fmt::format("decoding E4M3 codes [{}]: LibTorch {}.{} has no float8 types",
                          fmt::join(codes.sizes(), ", "), TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
}
#endif

}  // namespace tessera::compat
