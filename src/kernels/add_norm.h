#pragma once
// A residual add fused with the RMSNorm / LayerNorm that follows it (the autograd ops are
// nn::addRmsNorm / nn::addLayerNorm, nn/fused_norm.h): forward s = x + branch, y = norm(s) (norm.h's
// math); backward gx = gbranch = norm_backward(gy) + gs (gs: s's gradient from the residual path),
// gw and gb as norm.h's. branch may be undefined: then s is x itself.
// Local, no communication. x as norm.h's x; branch of x's shape, floating, any layout, on x's
// device. s has the dtype of x + branch (ATen's type promotion); y is `outDtype`; mean/rstd as
// norm.h. Backward: gy in y's dtype, gs of s's shape and dtype (undefined: zero); gx in s's dtype,
// gbranch in `branchDtype` (undefined without a branch; gx itself when the dtypes agree).
// Bad input: a tessera::Error naming the op and tensor. CPU tensors use the references (bitwise the
// separate add and norm); CUDA tensors norm.h's kernels with the add folded in, on the caller's
// current stream, no host synchronisation. Why fused, and the rounding: docs/design/kernels.md.
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
