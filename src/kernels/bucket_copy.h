#pragma once
// Multi-tensor copies between gradients and a flat communication bucket, with scaling and
// dtype conversion fused in. One call moves a whole bucket: on CUDA, a multi-tensor kernel
// on the caller's current stream (few launches for many tensors); on CPU, the reference
// implementation the tests compare against.
//
// Contract (local, no communication; all tensors on one device; throws tessera::Error naming
// the function, the tensor index, its shape/dtype/device, the offset and the bucket's
// numel/dtype/device when they do not fit):
// - flat (the bucket) is contiguous (any shape; addressed as flat.view(-1)); srcs[i] and
//   dsts[i] are contiguous; every dtype is fp32/bf16/fp16, the tensors' independently of the
//   bucket's. srcs/dsts and offsets have the same length (0 is fine: nothing happens).
// - offsets[i] is the element offset of tensor i in `flat`; [offsets[i], offsets[i] +
//   numel(i)) must lie inside flat and not overlap another tensor's range (empty tensors
//   overlap nothing). Elements of flat outside every range are left untouched.
// - Aliasing: a tensor may be exactly its own range of flat with flat's dtype (in-place
//   scaling, gradient_as_bucket_view); any other sharing with flat is an error. dsts must not
//   share memory with each other (not checked).
// - Math: x is read, converted to fp32, multiplied by float(scale) in fp32 (skipped when
//   float(scale) == 1), and rounded to the destination dtype to nearest even. The CUDA kernel
//   matches the reference bitwise (tests allow one ulp of the destination dtype).
// - Devices and streams: CPU tensors use the reference. CUDA tensors (builds with
//   TESSERA_HAVE_NCCL) launch asynchronously on the caller's current stream of the tensors'
//   device (tessera::cuda::currentStream); keep the tensors alive until that stream has run
//   it (the caching allocator does this for tensors freed on the same stream). Any other
//   device, or CUDA tensors in a build without CUDA, is an error.
#include <ATen/core/Tensor.h>

#include <vector>

namespace tessera::kernels {

// flat[offsets[i] : +n_i] = cast(srcs[i] * scale)  for every i.
void flattenScaleCast(const std::vector<at::Tensor>& srcs, const at::Tensor& flat,
                      const std::vector<int64_t>& offsets, double scale);
// dsts[i] = cast(flat[offsets[i] : +n_i])  for every i.
void unflattenCast(const at::Tensor& flat, const std::vector<at::Tensor>& dsts, const std::vector<int64_t>& offsets);

// The reference: ATen ops (copy_/mul), same checks and contract; what CPU tensors use.
void flattenScaleCastReference(const std::vector<at::Tensor>& srcs, const at::Tensor& flat,
                               const std::vector<int64_t>& offsets, double scale);
void unflattenCastReference(const at::Tensor& flat, const std::vector<at::Tensor>& dsts,
                            const std::vector<int64_t>& offsets);

}  // namespace tessera::kernels
