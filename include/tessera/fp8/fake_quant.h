#pragma once
// FP8 casts as values, for the CPU emulation of FP8 training and as the reference of the GPU path:
// fakeQuantize(t) = decode(codes) · scaleInv, each element an FP8 code times its scale's inverse.
// A GEMM of such tensors computes, up to the order of its float32 sums, what cuBLASLt's scaled FP8
// GEMM computes from the codes and scales.
// t is seen as 2-D [rows, cols] (t.reshape(-1, last dim)); scales by fp8/quantize.h's rule:
//   Axis::Tensor one for the tensor; Axis::Rows one per row (a GEMM reducing over cols);
//   Axis::Cols one per column (a GEMM reducing over rows).
// `amaxOver` of more than one rank: collective over it (amaxes all-reduced, MAX, so every rank casts
// its piece as the whole tensor would be; same axis, matching shapes on every rank); else local.
// The result has t's shape and dtype and no autograd history. CPU tensors (float32 / bfloat16 /
// float16), rounded as fp8::encode exactly; anything else, CUDA tensors included, is a
// tessera::Error. The emulation and the recipes: docs/design/fp8.md.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"
#include "tessera/fp8/format.h"
#include "tessera/fp8/quantize.h"

namespace tessera::fp8 {

enum class Axis { Tensor, Rows, Cols };

at::Tensor fakeQuantize(const at::Tensor& t, Format f, Axis axis, const CommPtr& amaxOver = nullptr);

// What the casts of this process did since the last take (fp8/quantize.h's Counts; every
// fakeQuantize adds to it, any thread; with current scaling only a float32 rounding of the scale
// can saturate). Local; train_gpt sums it over the ranks into each step's log.
Counts takeCounts();

// The training recipes (train_gpt --fp8): which GEMMs of a linear run in FP8 and how they scale.
//   Tensorwise: y = x·Wᵀ, gx = gy·W and gW = gyᵀ·x in FP8 (x, W: E4M3; gy: E5M2), a scale per tensor.
//   Rowwise:    y and gx in FP8 with a scale per row along each GEMM's reduction (x and gy per
//               token; W per output feature for y, per input feature for gx); gW in the input
//               precision (torchao's rowwise_with_gw_hp; why: docs/design/fp8.md).
enum class Recipe { Off, Tensorwise, Rowwise };
const char* name(Recipe r);          // "off" | "tensorwise" | "rowwise"
Recipe parseRecipe(const std::string& s);  // those spellings, else a tessera::Error naming them

}  // namespace tessera::fp8
