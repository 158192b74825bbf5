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

}  // namespace tessera::compat
