#pragma once
// The two FP8 formats of H100's tensor cores, as bit patterns, exactly (OCP 8-bit floating point;
// torch.float8_e4m3fn and torch.float8_e5m2; CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
//
//   E4M3 ("fn": finite): sign, 4 exponent bits (bias 7), 3 mantissa bits. Largest ±448
//        (S.1111.110); S.1111.111 is NaN; no infinities. Smallest normal 2^-6, subnormal 2^-9.
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like. Largest ±57344
//        (S.11110.11); S.11111.00 is ±infinity, S.11111.{01,10,11} NaN. Smallest normal 2^-14,
//        subnormal 2^-16.
//
// toFp8 rounds to the nearest representable value, ties to the even mantissa (exact, from the
// float's value: no double rounding). A magnitude that rounds above the largest finite value:
//   Overflow::Saturate   → ±largest (what a training recipe's scaled cast does: torchao, TE,
//                          CUDA's __NV_SATFINITE; ±infinity too);
//   Overflow::NoSaturate → E4M3: NaN (S.1111.111), E5M2: ±infinity (a plain conversion, as
//                          torch's float → float8 .to()).
// NaN → NaN with the input's sign (E4M3 S.1111.111, E5M2 S.11111.10). Zero keeps its sign.
// fromFp8 decodes every one of the 256 patterns exactly (NaN patterns to a float NaN).
// Plain C++, local; the CPU reference for the GPU cast kernels and the CPU emulation of FP8
// training (the layout tests run the FP8 maths through it).
#include <cstdint>

namespace tessera::fp8 {

enum class Format { E4M3, E5M2 };
enum class Overflow { Saturate, NoSaturate };

const char* name(Format f);    // "e4m3" | "e5m2"
float maxFinite(Format f);     // 448 | 57344
float minSubnormal(Format f);  // 2^-9 | 2^-16

uint8_t encode(float x, Format f, Overflow o = Overflow::Saturate);
float decode(uint8_t bits, Format f);
// decode(encode(x)): x rounded to the format (as a float).
inline float round(float x, Format f, Overflow o = Overflow::Saturate) { return decode(encode(x, f, o), f); }

}  // namespace tessera::fp8
