#pragma once
// RMSNorm and LayerNorm over the last dimension as autograd ops on tessera's kernels
// (kernels/norm.h: on CUDA one kernel forward, one backward; on CPU the ATen references). Float32 math:
//   rmsNorm:   y = x / sqrt(mean(x²) + eps) · weight
//   layerNorm: y = (x − mean(x)) / sqrt(var(x) + eps) · weight + bias   (bias may be undefined)
// x [..., d] any floating dtype (made contiguous); weight, bias [d], any floating dtype: the
// parameters, or their tp::copyToRegion with sequence parallel. The output is in x's dtype, or in
// CUDA autocast's dtype when autocast is on and x is a CUDA tensor. Gradients: x's dtype for x, the
// parameters' own dtypes for them.
// addRmsNorm / addLayerNorm: a pre-norm block's residual add and the norm after it, one op, one
// backward kernel. For a block's first norm (branch undefined) use s, not x, for the residual path,
// so that its gradient reaches this op.
// Local (no communication). Bad shapes or dtypes: a tessera::Error naming the op and the tensor.
// Why: docs/design/nn.md.
#include <ATen/core/Tensor.h>

namespace tessera::nn {

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor layerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

struct AddNormResult {
  at::Tensor s;  // the residual stream after the add
  at::Tensor y;  // its norm
};
// s = x + branch (in the dtype of x + branch; branch undefined: s is x, a view), y = norm(s) as
// above. Backward adds s's residual gradient to the norm's input gradient: x's and branch's
// gradient (branch's in its own dtype). Saves s, the weight and float32 row statistics [rows].
AddNormResult addRmsNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight, double eps);
AddNormResult addLayerNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                           const at::Tensor& bias, double eps);

}  // namespace tessera::nn
