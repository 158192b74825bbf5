#pragma once
// The FP8 training recipes' operand casts as values: fakeQuantize(t) = dequantize(quantize(t)),
// the float tensor whose every element is an FP8 code times its scale's inverse. A GEMM of such
// tensors computes, up to the order of its float32 sums, what cuBLASLt's scaled FP8 GEMM computes
// from the codes and scales: this is how the CPU runs the FP8 maths (the layout tests), and the
// reference the GPU path is checked against.
//
// t is seen as 2-D [rows, cols] (t.reshape(-1, last dim)). Scales (fp8/quantize.h's rule,
// scale = maxFinite / amax in float32, amax 0 or not finite → 1):
//   Axis::Tensor  one for the tensor;
//   Axis::Rows    one per row (amax over the row's columns): a GEMM reducing over cols;
//   Axis::Cols    one per column (amax over the rows):       a GEMM reducing over rows.
// `amaxOver`: when the logical tensor is split over a group along the dimensions an amax runs
// over (a tensor-parallel shard), the amaxes are all-reduced (MAX) over it first, so every rank
// quantizes its piece as the whole tensor would be: collective over that group, all its ranks
// calling with the same axis and their pieces' matching shapes. Null or a group of one: local.
// The result has t's shape and dtype and no autograd history (callers pass detached values).
// CPU tensors (float32 / bfloat16 / float16): the rounding is fp8::encode's, exactly. On CUDA a
// tessera::Error (the GPU path is cuBLASLt's FP8 GEMM on the codes, not this emulation).
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"
#include "fp8/format.h"
#include "fp8/quantize.h"

namespace tessera::fp8 {

enum class Axis { Tensor, Rows, Cols };

at::Tensor fakeQuantize(const at::Tensor& t, Format f, Axis axis, const CommPtr& amaxOver = nullptr);

// What the casts of this process did since the last take (fp8/quantize.h's Counts; every
// fakeQuantize adds to it, any thread; with current scaling only a float32 rounding of the scale
// can saturate). Local; train_gpt sums it over the ranks into each step's log.
Counts takeCounts();

// The training recipes (train_gpt --fp8): which GEMMs of a linear run in FP8 and how they scale.
//   Tensorwise: forward y = x·Wᵀ, input gradient gx = gy·W and weight gradient gW = gyᵀ·x all in
//               FP8 (x, W: E4M3; gy: E5M2), one scale per tensor.
//   Rowwise:    forward and input gradient in FP8 with a scale per row along each GEMM's
//               reduction (x per token, W per output feature forward and per input feature for
//               gx, gy per token); the weight gradient in the input precision (torchao's
//               rowwise_with_gw_hp: its scales would run along the tokens, so how a batch is split
//               into micro-batches and replicas would change them).
enum class Recipe { Off, Tensorwise, Rowwise };
const char* name(Recipe r);          // "off" | "tensorwise" | "rowwise"
Recipe parseRecipe(const std::string& s);  // those spellings, else a tessera::Error naming them

}  // namespace tessera::fp8
