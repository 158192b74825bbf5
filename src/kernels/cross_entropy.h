#pragma once
// This rank's pieces of the vocab-parallel cross-entropy (tp::vocabParallelCrossEntropy with
// `fused`, parallel/tensor/vocab.h), computed straight from the logits shard in its own dtype:
// no float32 copy of [N, V/tp], one read for the forward's pieces, one read and one write for the
// gradient. The op around them keeps Megatron's structure: the row max all-reduced (max) over
// tp, then the sum of exp and the target logit all-reduced (sum), then the mean loss.
//
// crossEntropyPartials(logits [N, W], targets [N] int64, start) → float32 [3, N]:
//   [0] m_i = max_j x_ij (this shard's row max)
//   [1] s_i = Σ_j exp(x_ij − m_i) (this shard's sum of exp, relative to its own max)
//   [2] x_{i, t_i − start} where this shard holds the target (start <= t_i < start + W), else 0
// Across ranks (the op): M_i = max_r m_i,r; S_i = Σ_r s_i,r · exp(m_i,r − M_i); loss_i =
// log S_i + M_i − x_{i,t_i}.
// crossEntropyGrad(logits, targets, start, M [N], S [N], gOverN) → [N, W] in logits' dtype:
//   grad_ij = exp(x_ij − M_i) · (g / (N · S_i)) − [j == t_i − start] · g / N
// with gOverN = g / N a float32 0-dim tensor on the logits' device (read by the kernel: no host
// synchronisation). crossEntropyGradInPlace writes the same gradient over the logits themselves and
// returns them (each element is read before it is written): no second [N, W] buffer, for a caller
// whose logits are dead after the loss.
//
// Contract (local): logits float32/bfloat16/float16 [N, W] (N, W > 0) with contiguous rows (row
// stride >= W: the first W columns of a padded buffer, train_gpt's logits of an odd vocabulary;
// a new gradient is contiguous, the in-place one keeps the logits' layout), targets
// contiguous int64 [N], M, S contiguous float32 [N], all on one device; else a tessera::Error
// naming the op and the tensor. Targets are not range-checked here (the op checks them on CPU;
// on CUDA a target no rank holds gives a zero target logit, as in Megatron-LM). CPU tensors use
// the references (ATen ops over chunks of rows, so the float32 temporaries stay bounded); CUDA
// tensors one kernel each (a block per row) on the caller's current stream.
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

// Whether t is 2-D with unit column stride and a row stride >= its width (what the kernels take).
bool rowsContiguous(const at::Tensor& t);
at::Tensor crossEntropyPartials(const at::Tensor& logits, const at::Tensor& targets, int64_t start);
at::Tensor crossEntropyGrad(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                            const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN);
at::Tensor crossEntropyGradInPlace(at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                   const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN);

at::Tensor crossEntropyPartialsReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start);
at::Tensor crossEntropyGradReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                     const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN,
                                     const at::Tensor& out = {});

}  // namespace tessera::kernels
