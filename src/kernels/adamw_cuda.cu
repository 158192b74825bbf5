// The fused AdamW kernel behind kernels::adamwStep for CUDA tensors (see adamw.h): one pass
// over the flat shard, each thread reading p, g, m, v once and writing p, m, v once, in the
// order of the ATen reference's ops (adamw_math.cuh). Rounding: every op is rounded separately (__f*_rn: no
// fused multiply-add contraction), so results stay within a few ulps of the CPU reference
// (sqrtf and division are IEEE-rounded on sm_90 with default flags).
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/adamw_cuda.h"
#include "kernels/adamw_math.cuh"

namespace tessera::kernels::detail {
namespace {

constexpr int kThreads = 256;

__global__ void adamwKernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, long long n, AdamWScalars s) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamwUpdate(pi, g[i], mi, vi, s.decay, s);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

std::string launchAdamW(float* p, const float* g, float* m, float* v, long long n, const AdamWScalars& s, void* stream,
                        int device) {
  if (n <= 0) return "";
  int prev = -1;
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  long long blocks = (n + kThreads - 1) / kThreads;
  const long long cap = static_cast<long long>(sms > 0 ? sms : 80) * 8;
  if (blocks > cap) blocks = cap;
  adamwKernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, g, m, v, n, s);
  err = cudaGetLastError();
  if (prev >= 0 && prev != device) cudaSetDevice(prev);
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tessera::kernels::detail
