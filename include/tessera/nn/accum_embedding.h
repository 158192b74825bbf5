#pragma once
// nn::embeddingAccumulateGrad: an embedding lookup whose weight gradient is summed straight into
// weight.grad, row by row, in float32 (the counterpart of accum_linear.h's linears):
//   fwd: y = weight[ids]  (as at::embedding: y [..., dim] in weight's dtype);
//   bwd: weight.grad[ids[i]] += gy[i] for every position i, as one index_put_ with accumulate
//        (deterministic: sorted by row on CUDA); a parameter without .grad gets a zeroed one.
// Local (no communication). ids: int64 or int32, any shape, values in [0, vocab); weight [vocab,
// dim]: a float32 leaf whose .grad, when defined, is float32, contiguous and of its shape (else a
// tessera::Error naming the op). No padding_idx, max_norm or scale_grad_by_freq. The op returns no
// gradient to weight's AccumulateGrad node, which still runs (its post hooks see .grad holding the
// sum). Without grad mode, or when weight does not require grad, it is at::embedding.
// Why: docs/design/nn.md.
#include <ATen/core/Tensor.h>

#include <functional>

namespace tessera::nn {

// untracked: the lookup keeps no autograd edge to `weight`, for a table another op also uses (a tied
// head): hooks on the weight then fire without waiting for this lookup. Its rows still reach .grad,
// or the weight's row-gradient sink; untracked without a sink is a tessera::Error. With a sink the
// weight may be of any floating dtype (FSDP's bf16 views); rows the sink declines are checked as above.
at::Tensor embeddingAccumulateGrad(const at::Tensor& ids, const at::Tensor& weight, bool untracked = false);

// Row-gradient sinks (DDP's and FSDP's gatherEmbeddingRows): a weight's sink is offered each
// backward's (ids int64 [n], rows [n, dim] in the gradient's dtype) first; returning true takes them
// (it sums them into .grad itself later), false has them summed here. Process-wide, thread-safe,
// keyed by the weight's TensorImpl; whoever installs a sink removes it (by installing an empty one).
using RowGradSink = std::function<bool(const at::Tensor& ids, const at::Tensor& rows)>;
void setRowGradSink(const at::Tensor& weight, RowGradSink sink);
bool hasRowGradSink(const at::Tensor& weight);

}  // namespace tessera::nn
