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
// the same shapes and kernel). A group of one is causal attention in two chunks. Shapes that do
// not fit are a tessera::Error naming them. The gathered K and V are [T, B, Hkv, D] on every
// rank: the memory this costs is what the ring of the other option would save (not built).
//
// The kernel per chunk (a chunk's mask is causal aligned to the bottom right: query j of c sees
// keys <= j + keys - c, so the fused kernels need no mask):
//   Flash      PyTorch's FlashAttention-2 (CUDA, bf16/fp16, D <= 256 and a multiple of 8; kv
//              heads read in place, GQA without copies);
//   Efficient  PyTorch's memory-efficient kernel (CUDA, fp32/bf16/fp16, D a multiple of 8; GQA's
//              K and V expanded to Hq heads);
//   Math       a materialised boolean mask (common/attention.h), any device (the CPU path);
//   Auto       Flash, else Efficient, else Math where the inputs allow; Math on the CPU.
// Under CUDA autocast q, k and v are first cast to its dtype (as scaled_dot_product_attention
// is), so Auto finds bf16 there. Flash and Efficient exist in builds against a CUDA LibTorch
// >= 2.5; asking for one the build or the inputs (device, dtype, D) do not allow is a
// tessera::Error naming them.
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace tessera::cp {

enum class Kernel { Auto, Flash, Efficient, Math };

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CommPtr& cp,
                     Kernel kernel = Kernel::Auto);
// Whether this build has the fused CUDA kernels (Flash, Efficient).
bool fusedKernelsBuilt();
const char* kernelName(Kernel kernel);

}  // namespace tessera::cp
