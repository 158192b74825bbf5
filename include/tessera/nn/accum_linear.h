#pragma once
// nn::linearAccumulateGrad: a linear whose parameter gradients are summed in float32 by the GEMM
// itself, straight into the parameters' .grad (Megatron-LM's gradient_accumulation_fusion):
//   fwd: y = x Wᵀ (+ b), as at::linear computes it (under CUDA autocast: x, W and b in the
//        autocast dtype, W and b through autocast's cast cache; y in that dtype);
//   bwd: gx = gy W;  W.grad += gyᵀ x  and  b.grad += Σ gy, in float32 (kernels/gemm_accumulate.h;
//        a parameter without .grad gets a fresh one, written by the GEMM, not zeroed first).
// Local (no communication). weight [out, in] and bias [out] (or undefined): float32 leaves whose
// .grad, when defined, is float32, contiguous and of their shape (so not FSDP's bf16 units); x
// [..., in]. Anything else is a tessera::Error naming the tensor and what was wrong. The op hands no
// gradient to the parameters' AccumulateGrad nodes, which still run: their post hooks (DDP's) fire
// with .grad holding the sum. Without grad mode, or when neither x nor the parameters require
// grad, it is at::linear. Why, and what it saves: docs/design/nn.md.
#include <ATen/core/Tensor.h>

namespace tessera::nn {

at::Tensor linearAccumulateGrad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// The same accumulation for ops that compute their own gradients (parallel/tensor's layers), which
// then return no gradient for these parameters: checkAccumulatable() before the op runs (the checks
// above, naming `op` and `what`); in backward accumulateWeightGrad: weight.grad += gyᵀ x (gy [k, out],
// x [k, in], one dtype) and accumulateBiasGrad: bias.grad += Σ gy over rows, in float32. Local.
// Inside a DeferWeightGrads scope (deferred_grads.h) both only record their work (so does
// linearAccumulateGrad, which calls them).
void checkAccumulatable(const char* op, const char* what, const at::Tensor& param);
void accumulateWeightGrad(const at::Tensor& weight, const at::Tensor& gy, const at::Tensor& x);
void accumulateBiasGrad(const at::Tensor& bias, const at::Tensor& gy);

}  // namespace tessera::nn
