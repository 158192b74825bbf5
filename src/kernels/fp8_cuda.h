#pragma once
// Internal (kernels/ only): the launchers behind kernels/fp8.h, the FP8 casts (fp8_cast_cuda.cu)
// and cuBLASLt's scaled FP8 GEMM (fp8_gemm_cuda.cu). No torch and no CUDA type appears here.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

// Which amax a value is scaled by: one for the tensor, one per row, one per column.
enum class Fp8Axis : int { Tensor = 0, Rows = 1, Cols = 2 };

// amax[0 | rows | cols] = max |x| over the tensor / each row / each column (NaN ignored, as
// fp8/quantize.cpp's fmax), x a contiguous [rows, cols] of `type`. The launcher zeroes amax first.
std::string launchFp8Amax(const void* x, ElemType type, long long rows, long long cols, Fp8Axis axis, float* amax,
                          const Launch& l);

struct Fp8CastArgs {
  const void* x;  // contiguous [rows, cols]
  ElemType type;
  long long rows, cols;
  bool e5m2;          // else E4M3
  Fp8Axis axis;       // which entry of amax scales x[r, c]: [0], [r] or [c]
  const float* amax;  // from launchFp8Amax (all-reduced over a group or not)
  uint8_t* codes;     // [rows, cols], or null
  uint8_t* codesT;    // [cols, rows] (the same codes transposed), or null
  float* scaleInv;    // [1 | rows | cols]: 1 / scale of each amax (written once per amax)
  float* counts;      // [2]: underflows and saturated values are added here (float32)
};
// codes = fp8::encode(x · scale, saturating), scale = maxFinite / amax (1 for 0 or not finite):
// bit for bit fp8/quantize.h's castCounted.
std::string launchFp8Cast(const Fp8CastArgs& a, const Launch& l);

// D[m, n] (row-major, leading dimension ldd) = (aScale · bScale) · A[m, k] · B[n, k]ᵀ (+ D when
// `accumulate`), A and B row-major FP8 codes (k contiguous: cuBLASLt's "TN" layout), float32
// accumulation. Scales are the dequantization factors (1 / scale): one float each, or with
// `outerScales` one per row of A ([m]) and of B ([n]) (cuBLASLt's outer-vector scaling).
struct Fp8GemmArgs {
  const uint8_t* a;
  const uint8_t* b;
  bool aE5M2, bE5M2;  // not both (cuBLASLt has no E5M2 × E5M2)
  const float* aScale;
  const float* bScale;
  bool outerScales;
  void* d;
  ElemType dType;  // F32 with `accumulate`
  long long m, n, k, ldd;
  bool accumulate;
  bool fastAccum;  // cuBLASLt's FAST_ACCUM (the forward GEMM in torchao's recipes)
  void* workspace;
  size_t workspaceBytes;
};
std::string launchFp8Gemm(const Fp8GemmArgs& a, const Launch& l);

}  // namespace tessera::kernels::detail
