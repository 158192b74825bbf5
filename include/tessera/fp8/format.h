#pragma once
// The two FP8 formats of H100's tensor cores as bit patterns, exactly (OCP 8-bit floating point;
// torch.float8_e4m3fn / float8_e5m2; CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
//   E4M3 ("fn": finite): exponent bias 7, 3 mantissa bits; largest ±448; S.1111.111 NaN; no ±inf.
//   E5M2: exponent bias 15, 2 mantissa bits, IEEE-like; largest ±57344; ±infinity; NaNs.
// encode rounds to the nearest value, ties to the even mantissa, from the float's value (no double
// rounding). Above the largest finite value, Saturate clamps to ±largest, ±infinity included (a
// recipe's scaled cast: torchao, TE, __NV_SATFINITE); NoSaturate gives E4M3 NaN, E5M2 ±infinity
// (a plain conversion, as torch's .to()).
// NaN → NaN of the input's sign; zero keeps its sign. decode is exact for all 256 patterns.
// Plain C++, local, no errors: the CPU reference of the GPU cast kernels and of the CPU emulation.
// Bit layouts and the choices behind them: docs/design/fp8.md.
#include <cstdint>

namespace tessera::fp8 {

enum class Format { E4M3, E5M2 };
enum class Overflow { Saturate, NoSaturate };

const char* name(Format f);    // "e4m3" | "e5m2"
float maxFinite(Format f);     // 448 | 57344
float minSubnormal(Format f);  // 2^-9 | 2^-16

// The code of x: nearest, ties to even; overflow as `o` says.
uint8_t encode(float x, Format f, Overflow o = Overflow::Saturate);
// The value of `bits`, exactly (the NaN patterns: a float NaN).
float decode(uint8_t bits, Format f);
// decode(encode(x)): x rounded to the format (as a float).
inline float round(float x, Format f, Overflow o = Overflow::Saturate) { return decode(encode(x, f, o), f); }

}  // namespace tessera::fp8
