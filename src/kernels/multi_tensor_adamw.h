#pragma once
// AdamW over a list of tensors in a few kernel launches (torch.optim.AdamW(fused=True)'s
// multi-tensor apply): the update of kernels/adamw.h applied to every (param, grad, expAvg,
// expAvgSq) of the lists, with `s`'s weight decay where decay[i] and none elsewhere (the
// weight-decay mask, e.g. optim::decaysByName), and optionally a bfloat16 copy of each updated
// parameter written in the same pass (model weights kept in bf16 beside fp32 masters).
//
// Contract (local, no communication): the lists have equal lengths (bf16Copies: empty, or that
// length); params[i], grads[i], expAvgs[i], expAvgSqs[i] are contiguous float32 tensors of one
// numel, bf16Copies[i] a contiguous bfloat16 tensor of that numel, all on one device; else a
// tessera::Error naming the function, the list, the index and the tensor. Empty tensors are
// skipped. step s.step >= 1.
// CPU tensors: adamwStepReference per tensor (bitwise optim::AdamW's per-tensor path) and
// copy_ into the copies. CUDA tensors (builds with CUDA): the tensors are cut into chunks of
// 65536 elements and up to 40 tensors go to one launch on the caller's
// current stream (asynchronous; the argument list travels in the launch itself: no host
// synchronisation, no device allocation); per element the math of the per-tensor kernel
// (adamw_math.cuh), so both CUDA paths agree bitwise and stay within a few ulps of the CPU
// reference (tests/kernels/test_adamw_gpu.cpp states the bound).
// gradScale: undefined, or a one-element float32 tensor on the params' device (clipping's
// coefficient, computed on the device: no host synchronisation). Every gradient is then read
// multiplied by it, rounded once, so the step is bitwise the step on gradients scaled first
// (at::_foreach_mul_); the gradients themselves are not written.
#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/adamw.h"

namespace tessera::kernels {

void multiTensorAdamW(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& expAvgs, const std::vector<at::Tensor>& expAvgSqs,
                      const std::vector<bool>& decay, const AdamWStep& s,
                      const std::vector<at::Tensor>& bf16Copies = {}, const at::Tensor& gradScale = {});

// The gradScale rule above (undefined, or one float32 value on `like`'s device), for every
// optimizer path that takes one; a tessera::Error naming `op` otherwise.
void checkGradScale(const char* op, const at::Tensor& gradScale, const at::Tensor& like);

}  // namespace tessera::kernels
