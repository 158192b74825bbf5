#pragma once
// Multi-tensor copies between gradients and a flat communication bucket, with scaling and dtype
// conversion fused in; one call moves a whole bucket. Local, no communication; all on one device.
// - flat (the bucket) is contiguous, addressed as flat.view(-1); srcs[i] and dsts[i] contiguous;
//   every dtype fp32/bf16/fp16, each independent of the bucket's. Lists of one length (0: nothing).
// - offsets[i]: tensor i's element offset in flat; its range lies inside flat and overlaps no other
//   (empty tensors overlap nothing). Elements of flat outside every range are left untouched.
// - Aliasing: a tensor may be exactly its own range of flat in flat's dtype (in-place scaling);
//   any other sharing with flat is an error. dsts must not share memory (not checked).
// - Math: read, converted to fp32, times float(scale) (skipped when 1), rounded to nearest even.
// - CPU tensors use the reference. CUDA tensors (builds with TESSERA_HAVE_NCCL): one launch on the
//   caller's current stream, asynchronous: keep the tensors alive until that stream has run it.
// Errors: tessera::Error naming the function, the tensor index, its shape/dtype/device, the offset
// and the bucket, for any of the above, another device, or CUDA tensors in a build without CUDA.
// The bucket's uses and the kernel's precision: docs/design/kernels.md.
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
