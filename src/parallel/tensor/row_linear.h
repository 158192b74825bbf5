#pragma once
// tp::rowLinearReduce: the row-parallel linear as one autograd op (Megatron's RowParallelLinear
// with its "g" reduction folded in):
//   fwd: y = Σ_tp x_r W_rᵀ (+ b, added once) — all-reduced over tp, or with sequenceParallel
//        reduce-scattered along dim 0 (each rank keeps its token shard);
//   bwd: (sequenceParallel: all-gather gy along dim 0)  gx = gy W_r, gW = gyᵀ x_r, gb = Σ gy.
// overlap.forwardChunks > 1: the output in pieces, each piece's collective beside the next piece's
// GEMM; overlap.ring (rows divisible by tp): the forward reduction as a ring of point-to-point
// transfers, whose sums differ from NCCL's by rounding. docs/design/tensor_parallel.md has both.
// Collective over tp in forward and (sequenceParallel) backward; a group of one must not call it.
// x: [..., in/tp] ([tokens, ..., in/tp] with sequenceParallel, tokens divisible by tp); weight
// [out, in/tp]; bias [out] or undefined. Returns [..., out] ([tokens/tp, ..., out]) in x's dtype
// (under CUDA autocast x comes in the autocast dtype; W and b are cast to it). Streams as
// linear_overlap.h. accumulateGrad: gW, gb summed in float32 into .grad by the GEMM, not returned.
// fp8: the recipe's GEMMs on FP8 operands, amaxes all-reduced over tp (fp8/fake_quant.h).
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/tensor/linear_overlap.h"

namespace tessera::tp {

at::Tensor rowLinearReduce(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const CommPtr& tp,
                           bool sequenceParallel, LinearOverlap overlap, bool accumulateGrad = false,
                           fp8::Recipe fp8 = fp8::Recipe::Off);

}  // namespace tessera::tp
