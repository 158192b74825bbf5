#pragma once
// The MLPs' elementwise steps, forward and backward in one pass each (the autograd ops are
// nn::swiglu and nn::biasGelu, nn/fused_activations.h):
//   SwiGLU of a fused [gate | up] projection h [..., 2F]: y = silu(g) · u [..., F]; backward gh
//   [..., 2F]. Bias + GELU (erf form, at::gelu's default) of a projection h [..., F] without its
//   bias: y = gelu(h + b); backward gh and gb = Σ_rows gh (float32 [F], summed in a fixed order).
// Math in float32, each result rounded once to h's dtype.
// Local, no communication. h contiguous, float32/bfloat16/float16; bias [F] of any floating dtype
// on h's device (read as float32); gy of y's shape and h's dtype, any layout. Else a tessera::Error
// naming the op and the tensor. CPU tensors use the references (ATen ops in float32); CUDA tensors
// the kernels, on the caller's current stream, no host synchronisation.
// The backward formulas and the rounding against unfused ops: docs/design/kernels.md.
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

at::Tensor swigluForward(const at::Tensor& h);
at::Tensor swigluBackward(const at::Tensor& gy, const at::Tensor& h);

struct BiasGeluGrads {
  at::Tensor gh, gb;  // gb: float32 [F]
};
at::Tensor biasGeluForward(const at::Tensor& h, const at::Tensor& bias);
BiasGeluGrads biasGeluBackward(const at::Tensor& gy, const at::Tensor& h, const at::Tensor& bias);

at::Tensor swigluForwardReference(const at::Tensor& h);
at::Tensor swigluBackwardReference(const at::Tensor& gy, const at::Tensor& h);
at::Tensor biasGeluForwardReference(const at::Tensor& h, const at::Tensor& bias);
BiasGeluGrads biasGeluBackwardReference(const at::Tensor& gy, const at::Tensor& h, const at::Tensor& bias);

}  // namespace tessera::kernels
