#pragma once
// The caller's current CUDA stream, for code that must order its own CUDA work with tessera's
// collectives (benchmarks, tests). No CUDA type appears: streams are passed as void*
// (a cudaStream_t). Only meaningful in builds with NCCL (TESSERA_HAVE_NCCL).
namespace tessera::cuda {

// Local. The stream the caller's CUDA work goes to on `device`: LibTorch's current stream
// (c10::cuda::getCurrentCUDAStream) when tessera's LibTorch has CUDA, else the legacy
// default stream (CPU-only LibTorch cannot hold CUDA tensors anyway).
void* currentStream(int device);

}  // namespace tessera::cuda
