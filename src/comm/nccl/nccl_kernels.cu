// Small device kernels of the NCCL backend.
#include <cstdint>

#include "comm/nccl/cuda_glue.h"

namespace tessera::nccl_detail {
namespace {

template <typename T>
__global__ void divideKernel(T* data, long long n, T divisor) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    data[i] = data[i] / divisor;  // C++ division truncates toward zero, as the contract says
  }
}

}  // namespace

void launchIntDivide(void* data, long long numel, int elemBytes, int divisor, cudaStream_t stream) {
  if (numel == 0) return;
  const int threads = 256;
  long long blocks = (numel + threads - 1) / threads;
  if (blocks > 4096) blocks = 4096;
  if (elemBytes == 8) {
    divideKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<int64_t*>(data), numel,
                                                                       static_cast<int64_t>(divisor));
  } else {
    divideKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(static_cast<int32_t*>(data), numel,
                                                                       static_cast<int32_t>(divisor));
  }
}

}  // namespace tessera::nccl_detail
