#pragma once
// FP8 on real codes: the scaled casts (amax, scale, cast and transpose; fp8/quantize.h's rule) and
// the scaled GEMM on their codes. On CUDA tensors: the cast kernels (fp8_cast_cuda.cu) and
// cuBLASLt's FP8 matmul (fp8_gemm_cuda.cu, no host synchronisation: amaxes and scales stay on the
// device); on CPU tensors: the reference, the same codes bit for bit (fp8/format.h's encode) and
// a GEMM of the decoded values. The GPU recipes' linears (parallel/tensor/fp8_linear.h) use these;
// the CPU layout tests use fp8/fake_quant.h, which computes the same maths.
// Local, except that an `amaxOver` group makes fp8Quantize collective over it (the amaxes
// all-reduced, MAX: every rank then scales its piece as the whole tensor would be).
// Work runs on the caller's current stream. Errors (tessera::Error) name the op, tensor, shape
// and dtype: a non-2-D input, codes on another device, a dimension cuBLASLt's FP8 kernels cannot
// take (not a multiple of 16), E5M2 × E5M2.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"
#include "tessera/fp8/fake_quant.h"

namespace tessera::kernels {

struct Fp8Codes {
  fp8::Format format = fp8::Format::E4M3;
  fp8::Axis axis = fp8::Axis::Tensor;
  at::Tensor codes;     // uint8 [rows, cols], or undefined when not asked for
  at::Tensor codesT;    // uint8 [cols, rows] (the same codes, transposed), or undefined
  at::Tensor amax;      // float32 [1 | rows | cols] (after the all-reduce)
  at::Tensor scaleInv;  // float32, amax's shape: 1 / scale, the GEMM's dequantization factor
};

struct Fp8QuantizeOptions {
  bool codes = true;          // x's codes, row-major
  bool transposed = false;    // xᵀ's codes, for the GEMM that reduces over x's rows
  CommPtr amaxOver;           // all-reduce the amaxes (MAX) over this group first; null: local
  at::Tensor amax;            // reuse these amaxes (a recast in backward) instead of computing them
};

// x: a float32 / bfloat16 / float16 tensor seen as [rows, cols] (reshape(-1, last dim)).
// Values cast, underflows and saturated values are counted (fp8Counts).
Fp8Codes fp8Quantize(const at::Tensor& x, fp8::Format f, fp8::Axis axis, const Fp8QuantizeOptions& opts = {});

struct Fp8GemmOptions {
  bool fastAccum = false;   // cuBLASLt's fast accumulation (the forward GEMM's, as torchao's recipes)
  at::Tensor accumulate;    // a float32 [m, n] contiguous tensor to add the product into, or undefined
  bool overwrite = false;   // with `accumulate`: the product replaces its contents (beta = 0)
};
// out[m, n] = (aScaleInv ⊗ bScaleInv) · decode(a)[m, k] · decode(b)[n, k]ᵀ in outDtype: a and b
// uint8 codes, k contiguous, scales float32 [1] each or [m] and [n] (one per row of a and of b).
// With opts.accumulate the product is added into it (float32; written over it with opts.overwrite)
// and it is returned.
at::Tensor fp8Gemm(const at::Tensor& a, const at::Tensor& aScaleInv, fp8::Format af, const at::Tensor& b,
                   const at::Tensor& bScaleInv, fp8::Format bf, at::ScalarType outDtype,
                   const Fp8GemmOptions& opts = {});

// What this process's casts counted since the last call (CUDA counts live on the devices and are
// read here: one synchronisation, once per logged step), zeroed.
fp8::Counts takeFp8Counts();
// The same without a host synchronization: int64 [3] {values, underflows, saturated} on `device`
// (this process's host counts plus `extra`, and the kernels' counts on that device, zeroed after
// the read in stream order). On the CPU a CPU tensor. Local.
at::Tensor takeFp8CountsOn(const at::Device& device, fp8::Counts extra = {});

}  // namespace tessera::kernels
