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

__global__ void fingerprintWriteKernel(int64_t* dst, int64_t w0, int64_t w1, int64_t w2, int64_t w3) {
  dst[0] = w0;
  dst[1] = w1;
  dst[2] = w2;
  dst[3] = w3;
}

// One block. Every rank's words equal rank 0's, else the first mismatch of the communicator is
// recorded in host-mapped memory: the gathered words, then (after a system-wide fence) its seq.
__global__ void fingerprintCompareKernel(const int64_t* all, int words, int64_t seq, int64_t* host) {
  __shared__ int differ;
  if (threadIdx.x == 0) differ = 0;
  __syncthreads();
  for (int k = threadIdx.x; k < words; k += blockDim.x) {
    if (all[k] != all[k % 4]) differ = 1;
  }
  __syncthreads();
  if (!differ || *reinterpret_cast<volatile int64_t*>(host) != 0) return;
  for (int k = threadIdx.x; k < words; k += blockDim.x) host[1 + k] = all[k];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile int64_t*>(host) = seq;
}

}  // namespace

void launchFingerprintWrite(int64_t* dst, const int64_t* words, cudaStream_t stream) {
  fingerprintWriteKernel<<<1, 1, 0, stream>>>(dst, words[0], words[1], words[2], words[3]);
}

void launchFingerprintCompare(const int64_t* all, int ranks, int64_t seq, int64_t* host, cudaStream_t stream) {
  fingerprintCompareKernel<<<1, 128, 0, stream>>>(all, 4 * ranks, seq, host);
}

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
