#pragma once
// Weight-gradient GEMM that accumulates into a float32 buffer (Megatron's
// gradient_accumulation_fusion): acc += aᵀ b, with a and b in the compute dtype (bf16/fp16/fp32)
// and the sum kept in fp32 by the GEMM itself: no separate cast of the product to fp32 and no
// separate acc += product pass over the parameter-sized gradient.
//
// Contract (local, no communication): acc is a contiguous float32 [m, n] tensor; a [k, m] and
// b [k, n] are contiguous, of one floating dtype (float32, bfloat16 or float16), all on one
// device (else tessera::Error naming the tensor, its shape, dtype and device). k may be 0
// (nothing to add). With `overwrite` the product replaces acc's contents instead (acc may then
// hold garbage, e.g. fresh at::empty).
// On CUDA tensors (builds with TESSERA_HAVE_NCCL): one cuBLAS GEMM (cublasGemmEx, fp32
// compute and output, beta = 1 or 0) on the caller's current stream, asynchronous. On CPU
// tensors: the reference, acc.addmm_(aᵀ, b) in float32 (a and b converted first).
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

void gemmAccumulateTN(const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite = false);

// acc += aᵀ b where acc may still be undefined: it is then made a float32 tensor of `sizes` on
// `device` and written by the GEMM (overwrite: no zeroing pass). Otherwise as gemmAccumulateTN
// (including its checks of acc against a and b).
void gemmAccumulateTNInto(at::Tensor& acc, at::IntArrayRef sizes, const at::Device& device, const at::Tensor& a,
                          const at::Tensor& b);

// A weight gradient aᵀ b as a fresh [m, n] tensor of `dtype` (the parameter's). A float32 result
// from bfloat16/float16 a and b comes straight out of the GEMM's float32 sum (gemmAccumulateTN with
// overwrite): more exact than a low-precision product cast up, and one pass over the gradient less.
// Other combinations: a.t().mm(b).to(dtype). Shapes and dtypes as gemmAccumulateTN (a, b may be
// non-contiguous: made contiguous first).
at::Tensor weightGradTN(const at::Tensor& a, const at::Tensor& b, c10::ScalarType dtype);
void gemmAccumulateTNReference(const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite = false);

}  // namespace tessera::kernels
