#pragma once
// The row-parallel linear as one autograd op (Megatron's RowParallelLinear with its "g"
// reduction folded in):
//
//   fwd: y = Σ_tp x_r W_rᵀ (+ b, added once: by rank 0 inside its GEMM, before the sum)
//        — the sum an all-reduce over tp, or with sequenceParallel a reduce-scatter along
//        dim 0 (each rank keeps its token shard);
//   bwd: (sequenceParallel: all-gather gy along dim 0)  gx = gy W_r, gW = gyᵀ x_r, gb = Σ gy.
//
// overlap.forwardChunks > 1 computes the output in pieces (rows; output features with
// sequenceParallel) and starts each piece's collective as soon as its GEMM is queued, so the
// collectives run beside the next pieces' GEMMs; with sequenceParallel the backward gathers
// gy in pieces likewise (seq_chunks.h). overlap.smCarveout SMs are kept free of the GEMMs
// that run beside a collective. The output is written in place and reduced in place: no copy
// (the ring below allocates each step's partial product and, without sequence parallel, the
// gathered output). overlap.ring (when the rows divide by the group's size p) reduces the forward by a ring
// instead, a GEMM + reduce-scatter decomposed by token shard: at step s = 0..p−1 each rank
// computes its partial product for the shard of rank (r − s − 1) mod p, adds the partial sum
// received from rank r − 1 and sends the total to rank r + 1 (point-to-point), so each transfer
// runs beside the next step's GEMM and the last step's shard is the rank's own. Only the last
// add waits on the network. Without sequenceParallel the shards are then all-gathered (that
// gather is exposed: half the bytes of the all-reduce it replaces). The bias is added to each
// rank's own shard. Sums run in another order than NCCL's, so results differ by rounding.
//
// Collective over tp in forward and (sequenceParallel) backward: every rank runs the same
// calls. x: [..., in/tp] (this rank's input features), or [tokens, ..., in/tp] with
// sequenceParallel (tokens divisible by tp); weight [out, in/tp]; bias [out] or undefined.
// Returns [..., out] ([tokens/tp, ..., out] with sequenceParallel) in x's dtype: under CUDA
// autocast the caller passes x in the autocast dtype (common/autocast.h), and W and b are cast
// to it, as at::linear under autocast does. A group of one must not call it (use at::linear).
// Streams as linear_overlap.h: collectives on the communicator's stream, ordered by events.
// accumulateGrad: gW and gb are summed in float32 straight into weight.grad / bias.grad by the
// GEMM (nn/accum_linear.h; the caller checks the parameters first) and not returned.
// fp8: the recipe's GEMMs on FP8 operands (fp8/fake_quant.h, the CPU emulation), scaled as the
// unsharded layer's would be (x's and W's amaxes all-reduced over tp).
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"
#include "parallel/tensor/linear_overlap.h"

namespace tessera::tp {

at::Tensor rowLinearReduce(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const CommPtr& tp,
                           bool sequenceParallel, LinearOverlap overlap, bool accumulateGrad = false,
                           fp8::Recipe fp8 = fp8::Recipe::Off);

}  // namespace tessera::tp
