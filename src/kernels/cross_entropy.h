#pragma once
// This rank's pieces of the vocab-parallel cross-entropy (tp::vocabParallelCrossEntropy with
// `fused`, parallel/tensor/vocab.h), straight from the logits shard in its own dtype; the op
// all-reduces them over tp (the algebra: docs/design/kernels.md).
// Local, no communication. logits float32/bfloat16/float16 [N, W] (N, W > 0) with contiguous rows
// (row stride >= W: the first W columns of a padded buffer), targets contiguous int64 [N], rowMax
// and sumExp contiguous float32 [N], all on one device; else a tessera::Error naming the op and the
// tensor. Targets are not range-checked here (the op checks them on the CPU; on CUDA a target no
// rank holds gives a zero target logit, as in Megatron-LM). CPU tensors use the references (ATen
// ops over chunks of rows); CUDA tensors one kernel each (a block per row) on the caller's current
// stream, no host synchronisation.
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

// Whether t is 2-D with unit column stride and a row stride >= its width (what the kernels take).
bool rowsContiguous(const at::Tensor& t);
// float32 [3, N]: this shard's row max m_i = max_j x_ij, s_i = Σ_j exp(x_ij − m_i), and the target
// logit x_{i, t_i − start} where start <= t_i < start + W, else 0.
at::Tensor crossEntropyPartials(const at::Tensor& logits, const at::Tensor& targets, int64_t start);
// [N, W] in logits' dtype, contiguous: exp(x_ij − M_i) · gOverN / S_i − [j == t_i − start] · gOverN,
// M = rowMax and S = sumExp over all shards, gOverN = g / N a float32 0-dim tensor on logits' device.
at::Tensor crossEntropyGrad(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                            const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN);
// The same gradient written over `logits` (each element read before it is written; their layout
// kept) and returned: no second [N, W] buffer, for a caller whose logits are dead after the loss.
at::Tensor crossEntropyGradInPlace(at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                   const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN);

// The references (ATen ops, any device): what CPU tensors use and the GPU tests compare with. `out`:
// where the gradient goes (the logits themselves for the in-place form), else a new tensor.
at::Tensor crossEntropyPartialsReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start);
at::Tensor crossEntropyGradReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                     const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN,
                                     const at::Tensor& out = {});

}  // namespace tessera::kernels
