#pragma once
// AdamW over lists of tensors in a few kernel launches (torch.optim.AdamW(fused=True)'s multi-tensor
// apply): kernels/adamw.h's update of every (param, grad, expAvg, expAvgSq), with `s`'s weight decay
// where decay[i] and none elsewhere, optionally writing a bfloat16 copy of each updated parameter.
// Local, no communication. The lists have equal lengths (bf16Copies: empty or that length);
// params[i], grads[i], expAvgs[i], expAvgSqs[i] contiguous float32 of one numel, bf16Copies[i]
// contiguous bfloat16 of it, all on one device; s.step >= 1; empty tensors skipped. Else a
// tessera::Error naming the function, the list, the index and the tensor.
// gradScale: undefined, or a one-element float32 tensor on the params' device (clipping's
// coefficient): every gradient is read multiplied by it (not written), bitwise the step on
// gradients scaled first. CPU tensors: adamwStepReference per tensor; CUDA tensors: launches on
// the caller's current stream, no host synchronisation, no device allocation.
// The launch layout and the bounds against the CPU: docs/design/kernels.md.
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
