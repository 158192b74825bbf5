#pragma once
// Megatron-style tensor-parallel linear layers over a tensor-parallel communicator `tp`.
// Forward and backward are collective over `tp` (see mappings.h). Weights are initialised
// exactly as the unsharded torch::nn::Linear(in, out) would be from the same RNG state (the
// full weight is drawn on every rank and this rank's shard kept): seed every rank alike
// before construction. loadFull() takes a full unsharded weight/bias and keeps the shard.
// A size not divisible by tp->size(), or an input of the wrong width or number of dimensions
// (sequence parallel: at least 2-D), is a tessera::Error naming the layer and the numbers.
#include <torch/nn/module.h>

#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/tensor/linear_overlap.h"

namespace tessera::tp {

struct ParallelLinearOptions {
  bool bias = true;
  // Column: all-gather the output's last dim (else each rank keeps out/tp features).
  bool gatherOutput = false;
  // Row: the input already holds this rank's in/tp features (else it is split here).
  bool inputIsParallel = true;
  // Sequence parallel: the input (Column) / output (Row) is sharded along dim 0 (tokens);
  // all-gather / reduce-scatter over dim 0 replace the f / g all-reduces.
  bool sequenceParallel = false;
  std::string name = "linear";  // for error messages
  // Draw the unsharded initial weights at construction (false: zeros; call loadFull).
  bool initFromRng = true;
  // Column: in backward, launch the input-gradient all-reduce (reduce-scatter with
  // sequenceParallel) asynchronously and compute the weight/bias gradients while it runs
  // (linear_overlap.h). false: the plain f / all-gather mapping + at::linear (the collective
  // runs after the weight gradient, in the mapping's backward), for comparison.
  bool overlapGradReduce = true;
  // Column with overlapGradReduce: called at each step of the overlapped backward (tests).
  LinearBackwardTrace backwardTrace;
  // Forward pieces, SM carveout and ring (linear_overlap.h; default: none of them): a row
  // layer reduces its output piece by piece while the next piece's GEMM runs; a column layer
  // with sequenceParallel gathers its input piece by piece. setOverlap() sets a whole model's.
  LinearOverlap overlap;
  // The weight and bias gradients are summed in float32 by the GEMM straight into .grad
  // (src/nn/accum_linear.h: micro-batches, pipeline stages; no bf16 gradient cast up and added),
  // at any tensor-parallel size: a group of one is nn::linearAccumulateGrad, the column/row ops
  // accumulate in their own backward. Needs float32 leaf parameters whose .grad, if any, is
  // float32, contiguous and of their shape (else a tessera::Error naming the layer); not with
  // FSDP (bf16 unsharded parameters).
  bool accumulateGradInGemm = false;
  // FP8 GEMMs by a training recipe (fp8/fake_quant.h: tensorwise or rowwise current scaling,
  // scales as the unsharded layer's). CPU tensors only (the emulation); needs overlapGradReduce.
  fp8::Recipe fp8 = fp8::Recipe::Off;
};

// y = x W^T + b with W split by output features: rank r holds rows [r·out/tp, (r+1)·out/tp).
// x: [..., in] (replicated), or [tokens/tp, ..., in] with sequenceParallel.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(CommPtr tp, int64_t in, int64_t out, ParallelLinearOptions o = {});
  at::Tensor forward(const at::Tensor& x);
  void loadFull(const at::Tensor& weight, const at::Tensor& bias = {});

  at::Tensor weight, bias;  // [out/tp, in], [out/tp]
  int64_t in, out;
  ParallelLinearOptions opts;
  CommPtr tp;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W split by input features: rank r holds columns [r·in/tp, (r+1)·in/tp).
// The partial products are summed over tp (or reduce-scattered along dim 0 with
// sequenceParallel) in one autograd op (row_linear.h); the bias is added once (by rank 0,
// before the sum). Under CUDA autocast the output is in the autocast dtype, as at::linear's.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(CommPtr tp, int64_t in, int64_t out, ParallelLinearOptions o = {});
  at::Tensor forward(const at::Tensor& x);
  void loadFull(const at::Tensor& weight, const at::Tensor& bias = {});

  at::Tensor weight, bias;  // [out, in/tp], [out]
  int64_t in, out;
  ParallelLinearOptions opts;
  CommPtr tp;
};
TORCH_MODULE(RowParallelLinear);

// Functional forms of the two layers' forward (what the modules above and the Python
// extension's torch.nn.Modules call): the caller owns the weight shards. `weight` is
// [out/tp, in] (column) or [out, in/tp] (row); `bias` may be undefined (opts.bias is ignored:
// the bias is used when defined). Same collectives, autograd and errors as forward().
at::Tensor columnParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const CommPtr& tp, const ParallelLinearOptions& opts);
at::Tensor rowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const CommPtr& tp, const ParallelLinearOptions& opts);

// Local: sets `overlap` on every Column/RowParallelLinear inside `root` (itself included), e.g.
// to try other forward pieces or SM carveouts on a built model.
void setOverlap(torch::nn::Module& root, const LinearOverlap& overlap);
// Local: sets ParallelLinearOptions::accumulateGradInGemm on every such layer inside `root`, and
// VocabParallelEmbedding::accumulateGrad on every embedding (its gradient summed row by row).
void setAccumulateGradInGemm(torch::nn::Module& root, bool on);
// Local: sets ParallelLinearOptions::fp8 on every such layer inside `root` (a block: the
// embedding and the head are other layers and stay as they are).
void setFp8(torch::nn::Module& root, fp8::Recipe recipe);

}  // namespace tessera::tp
