#pragma once
// The MLPs' elementwise steps, forward and backward in one pass each (the autograd ops are
// nn::swiglu and nn::biasGelu, nn/fused_activations.h):
//   SwiGLU of a fused [gate | up] projection h [..., 2F]:  y = silu(g) · u   [..., F]
//     backward: gg = gy · u · σ(g) · (1 + g · (1 − σ(g))),  gu = gy · silu(g)   → gh [..., 2F]
//   bias + GELU (erf form, at::gelu's default) of a projection without its bias, h [..., F]:
//     y = gelu(h + b);  backward: gz = at::gelu_backward(gy, h + b) → gh = gz, gb = Σ_rows gz
// Math in float32, each result rounded once to h's dtype (the unfused ops under autocast
// round after every op, so bf16 results differ from them by bf16 rounding; fp32 ones by
// float32 rounding of differently ordered ops). gb is float32 [F], summed per block of rows in
// the same pass and the blocks' partial sums added by a second small kernel (fixed order).
//
// Contract (local, no communication): h is contiguous, float32/bfloat16/float16, last dim
// 2F (SwiGLU) or F (bias + GELU, bias [F] of any floating dtype on h's device, read as float32);
// gy has y's shape, any layout, h's dtype. Else a tessera::Error naming the op and the tensor.
// CPU tensors use the references (ATen ops in float32); CUDA tensors the kernels on the
// caller's current stream, no host synchronisation.
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
