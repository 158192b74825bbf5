// The one place that asks LibTorch for the caller's current CUDA stream.
#include "comm/nccl/cuda_glue.h"

#include "comm/nccl/cuda_stream.h"

#ifdef TESSERA_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera {
namespace nccl_detail {

cudaStream_t callerStream(int device) {
#ifdef TESSERA_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return cudaStreamLegacy;
#endif
}

}  // namespace nccl_detail

void* cuda::currentStream(int device) { return static_cast<void*>(nccl_detail::callerStream(device)); }

}  // namespace tessera
