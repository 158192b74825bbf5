#pragma once
// Causal self-attention over a sequence split by context parallelism (chunks.h), by gathering
// K and V (Llama 3's choice: with grouped-query attention K and V are a fraction of Q's size):
//
//   fwd: all-gather k and v over cp along the sequence, reorder them to global positions, and
//        for each of this rank's two query chunks attend to the keys up to its own positions
//        (softmax(q kᵀ / sqrt(D) + causal mask on global positions) v);
//   bwd: autograd through the same ops; k's and v's gradients are reduce-scattered back to the
//        ranks holding them (tp::gatherSeq's pair).
//
// q: [T/cp, B, Hq, D], k and v: [T/cp, B, Hkv, D] (sequence first, this rank's shard in
// chunks.h's order), Hq a multiple of Hkv (each kv head serves Hq / Hkv query heads). Returns
// [T/cp, B, Hq, D]. Collective over `cp` in forward and backward (all its ranks call it with
// the same shapes). A group of one is causal attention in two chunks. Shapes that do not fit
// are a tessera::Error naming them. The gathered K and V are [T, B, Hkv, D] on every rank: the
// memory this costs is what the ring of the other option would save (not built).
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace tessera::cp {

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CommPtr& cp);

}  // namespace tessera::cp
