#pragma once
// Tensor-parallel communication as autograd ops (Megatron's f/g "mappings"). Each is named by
// its forward/backward pair. Each is collective over `tp` in forward AND in backward (every
// rank of the group must run the same forward and the same backward), and skips the
// communication entirely when the group has one rank. Tensors of any device the group's
// backend takes; the gathered/split dimension must exist (no 0-D tensors) and a split one
// divide evenly: otherwise a tessera::Error naming the op and the sizes, on every rank before
// any communication, also for a group of one.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"

namespace tessera::tp {

// "f"  fwd: identity            / bwd: all-reduce(sum)      (enter a column-parallel region)
at::Tensor copyToRegion(const at::Tensor& x, const CommPtr& tp);
// "g"  fwd: all-reduce(sum)     / bwd: identity              (leave a row-parallel region)
at::Tensor reduceFromRegion(const at::Tensor& x, const CommPtr& tp);
//      fwd: all-gather last dim / bwd: keep own split of the last dim
at::Tensor gatherLastDim(const at::Tensor& x, const CommPtr& tp);
//      fwd: keep own split of the last dim / bwd: all-gather last dim
at::Tensor splitLastDim(const at::Tensor& x, const CommPtr& tp);
// Sequence parallel (dim 0 is the sequence/token dim):
//      fwd: all-gather dim 0    / bwd: reduce-scatter dim 0
at::Tensor gatherSeq(const at::Tensor& x, const CommPtr& tp);
//      fwd: reduce-scatter dim 0 / bwd: all-gather dim 0
at::Tensor reduceScatterSeq(const at::Tensor& x, const CommPtr& tp);
//      fwd: keep own split of dim 0 / bwd: all-gather dim 0  (a replicated activation, e.g.
//      the embedding's output, enters the sequence-parallel region)
at::Tensor scatterSeq(const at::Tensor& x, const CommPtr& tp);

}  // namespace tessera::tp
