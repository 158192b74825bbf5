#pragma once
// Internal (kernels/ only): what the fused kernels' launchers (*_cuda.h) take besides device
// pointers. No torch and no CUDA type appears here, so the host side compiles without either.
namespace tessera::kernels::detail {

// Element types of activations and gradients (parameters and statistics are always fp32).
enum class ElemType : int { F32 = 0, BF16 = 1, F16 = 2 };

// Where a kernel runs: a cudaStream_t (as void*) of `device`. The launchers make `device`
// current for the launch, restore the previous one, enqueue asynchronously (no host
// synchronisation) and return "" or the CUDA error text.
struct Launch {
  void* stream;
  int device;
};

}  // namespace tessera::kernels::detail
