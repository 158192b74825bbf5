#pragma once
// RMSNorm and LayerNorm over the last dimension as autograd ops on tessera's kernels
// (kernels/norm.h): on CUDA one kernel forward and one backward (plus a small reduction for the
// weight and bias gradients), on CPU the ATen references (the CPU tests of every layout run
// them). Math in float32 (see kernels/norm.h):
//   rmsNorm:   y = x / sqrt(mean(x²) + eps) · weight
//   layerNorm: y = (x − mean(x)) / sqrt(var(x) + eps) · weight + bias   (bias may be undefined)
// x [..., d] any floating dtype (made contiguous); weight, bias [d], any floating dtype — the
// parameters, or their tp::copyToRegion with sequence parallel (its backward sums the gradients
// over tp). The output is in x's dtype, or in CUDA autocast's dtype when autocast is on and x is
// a CUDA tensor: a norm's output feeds a GEMM that would cast it, so the cast is folded into the
// kernel's store (the unfused norm under autocast returns float32 and the GEMM rounds it to
// bf16: the same values). Gradients: x's dtype for x, the parameters' own dtypes for them.
// Local (no communication). Bad shapes or dtypes: a tessera::Error naming the op and the tensor.
//
// addRmsNorm / addLayerNorm: a pre-norm block's residual add and the norm after it as one op
// (kernels/add_norm.h): s = x + branch (the new residual stream, in the dtype of x + branch),
// y = norm(s) (dtype as above). In backward s's gradient from the residual path is added to the
// norm's input gradient in the same kernel, and that sum is x's and branch's gradient (branch's
// in its own dtype): autograd's separate accumulation of the stream's gradients disappears.
// branch may be undefined: s is then x itself (a view of it, no copy) and only the backward's
// add is fused — for a block's first norm, whose input also goes on along the residual path:
// use s, not x, for that path so that its gradient reaches this op. The op saves s, the weight
// and the row statistics (float32 [rows]), as the norm alone saves x: no more memory.
#include <ATen/core/Tensor.h>

namespace tessera::nn {

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor layerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

struct AddNormResult {
  at::Tensor s;  // the residual stream after the add
  at::Tensor y;  // its norm
};
AddNormResult addRmsNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight, double eps);
AddNormResult addLayerNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                           const at::Tensor& bias, double eps);

}  // namespace tessera::nn
