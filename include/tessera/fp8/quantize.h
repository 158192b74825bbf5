#pragma once
// Scaled casts to FP8 with current ("dynamic") scaling, on CPU tensors: the reference of the GPU
// cast kernels (kernels/fp8.h) and the cast of the CPU emulation (fake_quant.h):
//   tensorwise: scale = maxFinite(f) / max|x|;   rowwise: scale[r] = maxFinite(f) / max|x[r, :]|
//   codes = encode(x · scale, f, Saturate);      x ≈ decode(codes) · scaleInv, scaleInv = 1 / scale
// x · scale and maxFinite / amax are float32 operations, as in the kernels (the codes match bit for
// bit); an amax of 0 or not finite gives scale 1. Counts are float32 scalars (a GPU never
// synchronises for them), over codes and codesT: underflows, non-zero finite values whose code is
// ±0; saturated, finite values clamped to the largest finite one.
// Local. Errors: x not a 2-D float32 / bfloat16 / float16 CPU tensor (a tessera::Error naming its
// shape and dtype). Why current scaling, and what the counts show: docs/design/fp8.md.
#include <ATen/core/Tensor.h>

#include "tessera/fp8/format.h"

namespace tessera::fp8 {

enum class Scaling { Tensorwise, Rowwise };
const char* name(Scaling s);  // "tensorwise" | "rowwise"

// What casts did: values cast, non-zero finite values whose code is ±0 (underflows), and values
// clamped to the largest finite one (saturated).
struct Counts {
  int64_t values = 0, underflows = 0, saturated = 0;
};
// The scale rule of every scaled cast: maxFinite(f) / amax in float32, 1 when amax is 0 or not
// finite.
float scaleFor(float amax, Format f);
// The code of x · scale (float32 product, saturating), counted into `c`. The one per-value cast
// of quantizeReference and fp8::fakeQuantize (fake_quant.h).
uint8_t castCounted(float x, float scale, Format f, Counts& c);

struct Quantized {
  Format format = Format::E4M3;
  Scaling scaling = Scaling::Tensorwise;
  at::Tensor codes;       // uint8 [rows, cols]
  at::Tensor scaleInv;    // float32 [1] or [rows, 1]: 1 / scale (the GEMM's dequantization factor)
  at::Tensor codesT;      // uint8 [cols, rows] when asked for, else undefined
  at::Tensor scaleInvT;   // float32 [1] or [cols, 1] with codesT
  at::Tensor underflows;  // float32 [1]: over codes (and codesT)
  at::Tensor saturated;   // float32 [1]
};

// x's codes and scales. With `transposed`, also those of xᵀ (contiguous [cols, rows]: the operand
// of backward's other GEMM; rowwise, its scales are per column of x).
Quantized quantizeReference(const at::Tensor& x, Format f, Scaling s, bool transposed = false);
// float32 [rows, cols]: decode(codes) · scaleInv (the transposed codes with transposed = true).
at::Tensor dequantizeReference(const Quantized& q, bool transposed = false);

}  // namespace tessera::fp8
