#pragma once
// Embedding lookup whose weight gradient is summed straight into weight.grad, row by row, in
// float32 — the embedding's counterpart of nn::linearAccumulateGrad (accum_linear.h), for
// training over several micro-batches (the first pipeline stage, gradient accumulation):
//
//   fwd: y = weight[ids]  (as at::embedding: y [..., dim] in weight's dtype, float32);
//   bwd: weight.grad[ids[i]] += gy[i] for every position i, as one index_put_ with accumulate
//        (deterministic: sorted by row on CUDA); a parameter without .grad gets a zeroed one.
//
// Why: at::embedding's backward builds a dense [vocab, dim] gradient per micro-batch (a zero
// fill plus a scatter), which autograd then adds into .grad: three passes over the whole table
// (262 MB each for the anchors' 32000 x 2048 vocabulary) to move the few rows the micro-batch
// touched. Here only those rows are written.
//
// Local (no communication). ids: an int64 or int32 tensor of any shape with values in
// [0, vocab); weight [vocab, dim]: a float32 leaf whose .grad, when defined, is float32,
// contiguous and of its shape (checked as accum_linear.h's checkAccumulatable, naming the op).
// No padding_idx, max_norm or scale_grad_by_freq. Like accumulateGrad linears, the op returns no
// gradient to weight's AccumulateGrad node, which still runs (its post hooks fire with .grad
// holding the sum). Without grad mode, or when weight does not require grad, it is at::embedding.
//
// Untracked (`untracked`): the lookup keeps no autograd edge to `weight`, for a weight that another
// op also uses and that gives it one (a tied head): gradient-ready hooks on the weight (DDP's) then
// fire once that op's backward is done, without waiting for this lookup, the last op of backward.
// Its rows still reach .grad, or the weight's row-gradient sink. An untracked lookup of a weight
// without a sink is a tessera::Error (its rows would be summed into .grad while DDP all-reduces it).
// With a sink the weight may be of any floating dtype (FSDP's bf16 views; FsdpOptions::
// gatherEmbeddingRows): rows the sink declines are then checked as above when they are summed.
//
// Row-gradient sinks (DDP's and FSDP's gatherEmbeddingRows): a sink installed for a weight is offered each
// backward's (ids int64 [n], rows [n, dim] in the gradient's dtype) first; when it returns true it
// has taken them (and sums them into .grad itself later), else they are summed here. Process-wide,
// thread-safe, keyed by the weight's TensorImpl; whoever installs a sink removes it (an empty one).
#include <ATen/core/Tensor.h>

#include <functional>

namespace tessera::nn {

at::Tensor embeddingAccumulateGrad(const at::Tensor& ids, const at::Tensor& weight, bool untracked = false);

using RowGradSink = std::function<bool(const at::Tensor& ids, const at::Tensor& rows)>;
void setRowGradSink(const at::Tensor& weight, RowGradSink sink);
bool hasRowGradSink(const at::Tensor& weight);

}  // namespace tessera::nn
