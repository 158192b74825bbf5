#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "spin_kernel.h"

namespace tessera::testing {
namespace {

__global__ void spinThenFill(float* data, long long n, float value, long long ns) {
  // %globaltimer counts nanoseconds, independent of the clock rate.
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<unsigned long long>(ns));
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    data[i] = value;
}

}  // namespace

void launchSpinThenFill(float* data, long long n, float value, double ms, void* stream) {
  spinThenFill<<<8, 256, 0, static_cast<cudaStream_t>(stream)>>>(data, n, value, static_cast<long long>(ms * 1e6));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("spinThenFill launch: ") + cudaGetErrorString(e));
}

}  // namespace tessera::testing
