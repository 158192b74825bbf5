#pragma once
// A residual add fused with the RMSNorm / LayerNorm that follows it (the autograd ops are
// nn::addRmsNorm / nn::addLayerNorm, nn/fused_norm.h). In a pre-norm transformer block the
// residual stream x takes a branch's output and is normalised at once:
//   forward:  s = x + branch (the new residual stream),  y = norm(s)          (norm.h's math)
//   backward: gs_total = norm_backward(gy) + gs  (gs: s's gradient from the residual path),
//             gx = gbranch = gs_total;  gw, gb as norm.h's backward
// so the stream is read once for both the add and the norm, and autograd's accumulation of the
// stream's two gradients (the residual path's and the norm's) happens inside the norm's backward
// pass. branch may be undefined: then s is x itself and only the backward's add remains (the
// first norm of a block, whose input also feeds the residual path).
//
// Contract (local, no communication): x as norm.h's x (contiguous [..., d], float32/bfloat16/
// float16); branch of x's shape, floating, any layout, on x's device. s has the dtype of x + branch
// (ATen's type promotion: float32 for a float32 stream and a bf16 branch under autocast); y is
// `outDtype`; mean/rstd as norm.h. Backward: gy in y's dtype, gs (may be undefined: zero) of s's
// shape in s's dtype; gx in s's dtype; gbranch in `branchDtype` (undefined when no branch; the
// same tensor as gx when the dtypes agree). Bad input: a tessera::Error naming the op and tensor.
// CPU tensors use the references (ATen's add, then norm.h's references: on the CPU the fused
// model's results equal those of the separate add and norm, bitwise). CUDA tensors: norm.h's
// kernels with the add folded into the forward's first pass and gs into the backward's gx, on
// the caller's current stream, no host synchronisation. Where the kernels do not cover the dtypes
// (a stream of lower precision than its branch) the add runs as an ATen op before the kernel.
// Rounding: on CUDA the backward adds gs before gx's one rounding (the separate ops round twice);
// the GPU test states the bounds (tests/kernels/test_fused_add_norm_gpu.cpp).
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "kernels/norm.h"

namespace tessera::kernels {

struct AddNormOutput {
  at::Tensor s;  // x + branch, or x itself without a branch
  at::Tensor y;
  at::Tensor mean, rstd;  // as NormOutput
};

struct AddNormGrads {
  at::Tensor gx, gbranch;  // gbranch: undefined without a branch
  at::Tensor gw, gb;       // as NormGrads
};

AddNormOutput addNormForward(NormKind kind, const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                             const at::Tensor& bias, double eps, c10::ScalarType outDtype);
// s: the forward's s; branchDtype: the branch's dtype (nullopt: there was no branch).
AddNormGrads addNormBackward(NormKind kind, const at::Tensor& gy, const at::Tensor& gs, const at::Tensor& s,
                             const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad,
                             c10::optional<c10::ScalarType> branchDtype);

// The references (ATen ops, any device): what CPU tensors use and the GPU tests compare with.
AddNormOutput addNormForwardReference(NormKind kind, const at::Tensor& x, const at::Tensor& branch,
                                      const at::Tensor& weight, const at::Tensor& bias, double eps,
                                      c10::ScalarType outDtype);
AddNormGrads addNormBackwardReference(NormKind kind, const at::Tensor& gy, const at::Tensor& gs, const at::Tensor& s,
                                      const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd,
                                      bool biasGrad, c10::optional<c10::ScalarType> branchDtype);

}  // namespace tessera::kernels
