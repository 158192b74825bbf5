#pragma once
// Internal (*_cuda.cu only): one element's AdamW update, shared by the per-tensor kernel
// (adamw_cuda.cu) and the multi-tensor one (multi_tensor_adamw_cuda.cu), in the order of the
// ATen reference's ops (kernels/adamw.h), every op rounded separately (__f*_rn: no fused
// multiply-add contraction). `decay` is 1 - lr * weightDecay (exactly 1 without weight decay:
// the multiply then changes nothing, as the reference's skipped one).
#include "kernels/adamw_cuda.h"

namespace tessera::kernels::detail {

__device__ __forceinline__ void adamwUpdate(float& p, float g, float& m, float& v, float decay,
                                            const AdamWScalars& s) {
  p = __fmul_rn(p, decay);
  m = __fadd_rn(__fmul_rn(m, s.beta1), __fmul_rn(g, s.oneMinusBeta1));
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(g, g), s.oneMinusBeta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.sqrtBc2), s.eps);
  p = __fadd_rn(p, __fmul_rn(-s.stepSize, __fdiv_rn(m, denom)));
}

}  // namespace tessera::kernels::detail
