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

// swiglu(h) · weightᵀ (the Llama MLP's w2 after its activation, without bias) as one autograd op
// that keeps h and not the product: backward recomputes silu(gate) · up (one kernel) for the
// weight gradient instead of holding the [..., F] product from forward to backward (F · 2 bytes
// per token per layer under bf16: 3.7 GB for llama3-8b at 4096 tokens). For selective recompute.
// weight [out, F] is the parameter (under CUDA autocast cast through autocast's cache, as
// at::linear would); with accumulateGrad its gradient is summed in float32 into weight.grad by
// the GEMM (nn/accum_linear.h's rules and checks, deferrable under ZB-H1) and not returned.
// Results are at::linear(swiglu(h), weight)'s. Local; bad shapes: a tessera::Error naming them.
at::Tensor swigluLinear(const at::Tensor& h, const at::Tensor& weight, bool accumulateGrad);

}  // namespace tessera::nn
