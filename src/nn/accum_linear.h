#pragma once
// Linear whose parameter gradients are summed in float32 by the GEMM itself, straight into the
// parameters' .grad (Megatron-LM's gradient_accumulation_fusion), for training over several
// micro-batches (pipeline stages, gradient accumulation):
//
//   fwd: y = x Wᵀ (+ b), as at::linear computes it (under CUDA autocast: x, W and b in the
//        autocast dtype, W and b through autocast's cast cache; y in that dtype);
//   bwd: gx = gy W;  W.grad += gyᵀ x  and  b.grad += Σ gy, in float32 (kernels/gemm_accumulate.h;
//        a parameter without .grad gets a fresh one, written by the GEMM, not zeroed first).
//
// Why: with float32 parameters under bf16 autocast, at::linear's backward produces a bf16 weight
// gradient that autograd casts to float32 and then adds into .grad: two parameter-sized passes
// per weight per micro-batch (on the anchors' GPT at micro-batch 2, 19 % more GPU time than the
// same tokens in one batch, bench/results/pp_1gpu.md). Here they are part of the GEMM.
//
// Local (no communication). weight [out, in] and bias [out] (or undefined) are float32 leaf
// tensors; their .grad, when defined, must be float32, contiguous and of their shape; x is
// [..., in]. Anything else is a tessera::Error naming the tensor and what was wrong.
// The op hands no gradient to the parameters' AccumulateGrad nodes; the autograd engine still
// runs them, so post hooks registered on them (DDP's gradient-ready hooks) fire, and .grad then
// already holds the sum (tests/nn on LibTorch 1.13 and 2.11; tests/parallel/data_parallel/ddp trains through
// DDP with it). Not for FSDP units: their bf16 parameters are refused above. Without grad mode, or
// when neither x nor the parameters require grad, it is at::linear.
#include <ATen/core/Tensor.h>

namespace tessera::nn {

at::Tensor linearAccumulateGrad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

// The same accumulation for ops that compute their own gradients (the tensor-parallel layers,
// parallel/tensor): checkAccumulatable() before the op runs (the checks above, naming `op` and
// `what`), then in backward accumulateWeightGrad: weight.grad += gyᵀ x (gy [k, out], x [k, in], one
// dtype; a missing .grad is created and written by the GEMM), accumulateBiasGrad: bias.grad += Σ gy
// over rows, in float32 (for bf16/fp16 gy [k, out] on CUDA one GEMM gyᵀ·1 into .grad, else a
// reduction and an add). Local; the op then returns no gradient for these parameters.
// Inside a DeferWeightGrads scope (nn/deferred_grads.h: a zero-bubble pipeline's B) both only
// record their work, which the scope's queue runs later (W); linearAccumulateGrad's too.
void checkAccumulatable(const char* op, const char* what, const at::Tensor& param);
void accumulateWeightGrad(const at::Tensor& weight, const at::Tensor& gy, const at::Tensor& x);
void accumulateBiasGrad(const at::Tensor& bias, const at::Tensor& gy);

}  // namespace tessera::nn
