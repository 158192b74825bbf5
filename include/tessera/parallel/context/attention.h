#pragma once
// cp::attention: causal self-attention over a sequence split by context parallelism (chunks.h),
// by gathering K and V:
//   fwd: all-gather k and v over cp along the sequence, reorder them to global positions, and
//        attend each of this rank's two query chunks to the keys up to its own positions;
//   bwd: autograd through the same ops; k's and v's gradients are reduce-scattered back to the
//        ranks holding them (tp::gatherSeq's pair).
// q: [T/cp, B, Hq, D], k and v: [T/cp, B, Hkv, D] (sequence first, this rank's shard in chunks.h's
// order), Hq a multiple of Hkv. Returns [T/cp, B, Hq, D]. The gathered K and V take [T, B, Hkv, D]
// on every rank. Collective over `cp` in forward and backward (all its ranks, with the same shapes
// and kernel); a group of one is causal attention in two chunks. Under CUDA autocast q, k and v are
// first cast to its dtype. Shapes that do not fit, or a kernel the build or the inputs do not
// allow: a tessera::Error naming them. Why (a gather, not a ring): docs/design/context_parallel.md.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"

namespace tessera::cp {

// Flash: PyTorch's FlashAttention-2 (CUDA, bf16/fp16, D <= 256 and a multiple of 8; GQA's kv heads
// read in place). Efficient: the memory-efficient kernel (CUDA, fp32/bf16/fp16, D a multiple of 8;
// K and V expanded to Hq heads). Math: a materialised mask, any device. Auto: Flash, else Efficient,
// else Math, as the inputs allow (Math on the CPU). Flash and Efficient need a CUDA LibTorch >= 2.5.
enum class Kernel { Auto, Flash, Efficient, Math };

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CommPtr& cp,
                     Kernel kernel = Kernel::Auto);
// Whether this build has the fused CUDA kernels (Flash, Efficient).
bool fusedKernelsBuilt();
const char* kernelName(Kernel kernel);

}  // namespace tessera::cp
