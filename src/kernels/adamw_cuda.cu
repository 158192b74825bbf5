// The fused AdamW kernel behind kernels::adamwStep for CUDA tensors (see adamw.h): one pass
// over the flat shard, each thread reading p, g, m, v once and writing p, m, v once, in the
// order of the ATen reference's ops. Rounding: every op is rounded separately (__f*_rn: no
// fused multiply-add contraction), so results stay within a few ulps of the CPU reference
// (sqrtf and division are IEEE-rounded on sm_90 with default flags).
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/adamw_cuda.h"

namespace tessera::kernels::detail {
namespace {

constexpr int kThreads = 256;

__global__ void adamwKernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, long long n, AdamWScalars s) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    float pi = __fmul_rn(p[i], s.decay);
    float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(gi, s.oneMinusBeta1));
    float vi = __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(gi, gi), s.oneMinusBeta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.sqrtBc2), s.eps);
    pi = __fadd_rn(pi, __fmul_rn(-s.stepSize, __fdiv_rn(mi, denom)));
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
