#pragma once
// Shared bits of the NCCL GPU tests.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "tessera/comm/backends.h"
#include "harness/multiprocess.h"

namespace tessera::testing {

// Skips the calling test (visibly) unless `n` CUDA devices are visible.
#define TESSERA_REQUIRE_GPUS(n)                                                                          \
  do {                                                                                                  \
    int have_ = ::tessera::cudaDeviceCount();                                                           \
    if (have_ < (n)) {                                                                                  \
      fmt::print("SKIP: needs {} CUDA devices, {} visible (NCCL {})\n", (n), have_, ::tessera::ncclVersion()); \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, " << have_ << " visible";                     \
    }                                                                                                   \
  } while (0)

// Skips the calling test (visibly) unless a CUDA device is visible and this LibTorch has CUDA
// (tessera can be built with CUDA and NCCL against a CPU LibTorch).
#define TESSERA_REQUIRE_CUDA_LIBTORCH()                                                  \
  do {                                                                                   \
    TESSERA_REQUIRE_GPUS(1);                                                             \
    if (!at::hasCUDA()) {                                                                \
      fmt::print("SKIP: this LibTorch has no CUDA (tessera built against CPU torch)\n"); \
      GTEST_SKIP() << "LibTorch without CUDA";                                           \
    }                                                                                    \
  } while (0)

// Run options for 2-rank NCCL runs (workers get `arg`): NVLink multicast stays off (the GPU
// machine's rule).
inline RunOptions gpuRun(int seconds, std::map<std::string, std::string> env = {}, std::string arg = "") {
  RunOptions o;
  o.ranks = 2;
  o.timeout = std::chrono::seconds(seconds);
  o.arg = std::move(arg);
  o.env = std::move(env);
  o.env["NCCL_NVLS_ENABLE"] = "0";
  o.env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1";
  o.env["NVSHMEM_DISABLE_NVLS"] = "1";
  return o;
}

}  // namespace tessera::testing
