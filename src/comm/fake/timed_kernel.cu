// The fake communicator's spin kernel (timed_stream.cpp).
#include <cuda_runtime_api.h>

#include <algorithm>

#include "comm/fake/timed_kernel.h"

namespace tessera::fake_detail {
namespace {

__device__ unsigned long long globalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread per block spins until `ns` have passed since the block started; the block's dynamic
// shared memory (when asked for) keeps other kernels' blocks off its SM meanwhile.
__global__ void spinKernel(unsigned long long ns) {
  extern __shared__ char hold[];
  if (threadIdx.x != 0) return;
  const unsigned long long t0 = globalNs();
  while (globalNs() - t0 < ns) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(500);
#endif
  }
  if (ns == 0) hold[0] = 0;  // never true for a timed op; keeps `hold` referenced
}

// Each block copies its slice of src into dst, wrapping around, until `ns` have passed (each
// thread reading the clock after every 4 of its 16-byte copies).
__global__ void trafficKernel(unsigned long long ns, const uint4* src, uint4* dst, size_t n) {
  extern __shared__ char hold[];
  const size_t per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per;
  const size_t hi = lo + per < n ? lo + per : n;
  if (lo + threadIdx.x >= hi) return;
  size_t i = lo + threadIdx.x;
  const unsigned long long t0 = globalNs();
  while (globalNs() - t0 < ns) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      dst[i] = src[i];
      i += blockDim.x;
      if (i >= hi) i = lo + threadIdx.x;
    }
  }
  if (ns == 0) hold[0] = 0;
}

}  // namespace

cudaError_t launchSpin(cudaStream_t stream, unsigned long long ns, int ctas, int device, void* scratch,
                       size_t scratchBytes) {
  if (ctas <= 0) {
    spinKernel<<<1, 32, 0, stream>>>(ns);
    return cudaGetLastError();
  }
  int smem = 0, sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  if (scratch) {
    e = cudaFuncSetAttribute(trafficKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const size_t n = scratchBytes / sizeof(uint4);
    auto* src = static_cast<const uint4*>(scratch);
    trafficKernel<<<std::min(ctas, sms), 512, static_cast<size_t>(smem), stream>>>(ns, src,
                                                                                   static_cast<uint4*>(scratch) + n, n);
    return cudaGetLastError();
  }
  e = cudaFuncSetAttribute(spinKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  spinKernel<<<std::min(ctas, sms), 32, static_cast<size_t>(smem), stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace tessera::fake_detail
