#pragma once
// Internal (kernels/ only): what norm.cpp shares with add_norm.cpp — the argument checks of the
// norms and their CUDA paths with the residual pieces (contracts in norm.h and add_norm.h).
#include <ATen/core/Tensor.h>

#include "kernels/norm.h"

namespace tessera::kernels::detail {

bool floatingType(c10::ScalarType t);  // float32, bfloat16 or float16
at::Tensor asFloat(const at::Tensor& t);

// x [..., d] contiguous float32/bfloat16/float16; weight (bias) floating [d] on x's device;
// RMSNorm takes no bias. Returns d; else a tessera::Error naming op and the tensor.
int64_t checkNormInputs(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias);
// mean (LayerNorm) and rstd: contiguous float32 [rows of x] on x's device.
void checkNormStats(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& mean,
                    const at::Tensor& rstd);

// The CUDA forward of norm(x), or with `branch` defined of norm(s), s = x + branch written into
// `s` (x's shape and dtype, contiguous; branch contiguous of x's shape, x's dtype or 16-bit when
// x is float32). Checked by the caller.
NormOutput normForwardCuda(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias, double eps, c10::ScalarType outDtype, const at::Tensor& branch,
                           const at::Tensor& s);
// The CUDA backward; with gres defined (contiguous, x's shape and dtype) gx = norm's gx + gres;
// with gbranch defined (contiguous, x's shape, any of the three dtypes) gx is also stored there.
NormGrads normBackwardCuda(const char* op, NormKind kind, const at::Tensor& gy, const at::Tensor& x,
                           const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad,
                           const at::Tensor& gres, const at::Tensor& gbranch);

}  // namespace tessera::kernels::detail
