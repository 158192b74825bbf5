#pragma once
// AdamW on flat fp32 tensors (FSDP's sharded optimizer steps each unit's shard with it).
//
// Contract (local, no communication): param, grad, expAvg, expAvgSq are contiguous fp32
// tensors of one device with the same numel (else tessera::Error naming the tensor). One
// call is one AdamW step number `step` (>= 1), in place on param, expAvg, expAvgSq:
//   param *= 1 - lr * weightDecay
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// which is torch::optim::AdamW's step (amsgrad off) element for element; the reference uses
// the same ATen ops in the same order, so it matches torch::optim::AdamW bitwise on CPU.
// adamwStep on CPU tensors is the reference; on CUDA tensors (builds with TESSERA_HAVE_NCCL)
// one fused kernel (adamw_cuda.cu) on the caller's current stream, each op rounded separately
// as in the reference (a few ulps apart at most: sqrt/division rounding of the ATen kernels).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::kernels {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 1e-2;
  int64_t step = 1;
};

void adamwStep(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& expAvg, const at::Tensor& expAvgSq,
               const AdamWStep& s);
void adamwStepReference(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& expAvg,
                        const at::Tensor& expAvgSq, const AdamWStep& s);

}  // namespace tessera::kernels
