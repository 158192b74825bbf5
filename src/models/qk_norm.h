#pragma once
// The Llama block's q/k RMSNorm (ModelConfig::qkNorm), before the rotation, on this rank's heads
// x [..., n, hd] in float32, returned in x's dtype: y = x / sqrt(mean(x²) + eps) · w. PerHead: the
// mean over each head's hd, w [hd] (one weight for all heads: its gradient summed over `tp`, whose
// ranks hold other heads). Whole (OLMoE): the mean over every head of the projection (width
// elements), w this rank's slice [n·hd]; with tp the sums of squares are all-reduced over `tp`
// (fwd all-reduce / bwd all-reduce), divided by `replicas` when each head lives on that many tp
// ranks (kv heads replicated); the slice's gradient is then summed over `kvGroup`. Collective over
// tp (and kvGroup) in forward and backward when they have more than one rank; else local.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"

namespace tessera::models::detail {

struct QkNormGroup {
  CommPtr tp;        // the block's tensor-parallel group (null or one rank: local)
  CommPtr kvGroup;   // Whole, k: the ranks sharing this rank's kv head (null: none)
  int replicas = 1;  // ranks holding each head (kv heads replicated over tp)
};

at::Tensor qkNorm(const at::Tensor& x, const at::Tensor& w, QkNorm kind, double eps, int64_t width,
                  const QkNormGroup& g);

}  // namespace tessera::models::detail
