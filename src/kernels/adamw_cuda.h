#pragma once
// Internal (kernels/ only): the launcher of the fused AdamW kernel in adamw_cuda.cu. No torch
// and no CUDA type appears here, so adamw.cpp compiles without either.
#include <string>

namespace tessera::kernels::detail {

// Scalars of one step, computed on the host (see adamw.h for the math).
struct AdamWScalars {
  float decay;      // 1 - lr * weightDecay
  float beta1, oneMinusBeta1, beta2, oneMinusBeta2;
  float sqrtBc2;    // sqrt(1 - beta2^step)
  float eps;
  float stepSize;   // lr / (1 - beta1^step)
};

// The scalars of step `step` of AdamW with (lr, beta1, beta2, eps, weightDecay): computed in double
// as the reference does, then rounded to float. Defined in adamw.cpp.
AdamWScalars adamwScalars(double lr, double beta1, double beta2, double eps, double weightDecay, long long step);

// Local, asynchronous: enqueues one fused kernel on `stream` (a cudaStream_t of `device`,
// as void*) updating p, m, v in place over n fp32 elements (device pointers). Makes `device`
// current for the launch and restores the previous one. Returns "" or the CUDA error text.
std::string launchAdamW(float* p, const float* g, float* m, float* v, long long n, const AdamWScalars& s, void* stream,
                        int device);

}  // namespace tessera::kernels::detail
