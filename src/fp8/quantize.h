#pragma once
// Scaled casts to FP8 (the training recipes' dynamic, "current" scaling), the CPU reference of the
// GPU cast kernels and the CPU emulation's cast:
//
//   tensorwise: amax = max |x| over the tensor;         scale = maxFinite(format) / amax
//   rowwise:    amax[r] = max |x[r, :]| over each row;  scale[r] = maxFinite(format) / amax[r]
//   codes = fp8::encode(x · scale, format, Saturate)    (fp8/format.h: nearest, ties to even)
//   x ≈ decode(codes) / scale  =  decode(codes) · scaleInv
//
// The products x · scale and maxFinite / amax are float32 operations (the kernels compute the same,
// so codes match bit for bit). An amax of 0 (all zeros) or not finite gives scale 1 (a NaN / inf in
// x is then carried into the codes as NaN / ±largest). With `transposed`, the codes of xᵀ (contiguous
// [cols, rows]) come with them: the operand layout of the other GEMM of backward; for rowwise
// scaling xᵀ's rows are x's columns, so its scales are columnwise (one more amax pass).
// Counts (float32 scalars, so a GPU never synchronises for them), over codes and codesT:
// `underflows`, non-zero finite values whose code is ±0 (lost to the format's range);
// `saturated`, finite values whose scaled magnitude rounded above the largest finite value and
// was clamped to it (with current scaling only a float32 rounding of the scale can cause that;
// the count shows it, and would show a stale scale).
// Local. x: a 2-D float32 / bfloat16 / float16 CPU tensor (anything else: a tessera::Error naming
// the shape and dtype).
#include <ATen/core/Tensor.h>

#include "fp8/format.h"

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

Quantized quantizeReference(const at::Tensor& x, Format f, Scaling s, bool transposed = false);
// float32 [rows, cols]: decode(codes) · scaleInv (the transposed codes with transposed = true).
at::Tensor dequantizeReference(const Quantized& q, bool transposed = false);

}  // namespace tessera::fp8
