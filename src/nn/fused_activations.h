#pragma once
// The MLPs' activations as single autograd ops on tessera's kernels (kernels/activations.h: one
// CUDA kernel forward, one backward; the ATen references on CPU), math in float32 with one
// rounding to h's dtype:
//   swiglu(h):         h [..., 2F] = [gate | up] (the Llama's fused w1|w3 output) → silu(gate) · up [..., F]
//   biasGelu(h, bias): h [..., F] a projection's output without its bias, bias [F] (the parameter,
//                      any floating dtype) → gelu(h + bias); bias's gradient (Σ over rows, float32,
//                      returned in the bias's dtype) comes from the same backward pass.
// Each saves only its input h (and the bias) for backward, like selective recomputation of the
// unfused activation: the activation's output is not kept by the op.
// Local (no communication). Bad shapes or dtypes: a tessera::Error naming the op and the tensor.
#include <ATen/core/Tensor.h>

namespace tessera::nn {

at::Tensor swiglu(const at::Tensor& h);
at::Tensor biasGelu(const at::Tensor& h, const at::Tensor& bias);

}  // namespace tessera::nn
