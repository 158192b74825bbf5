#pragma once
// Internal (kernels/ only): the launchers of the cross-entropy kernels in cross_entropy_cuda.cu
// (math and contract in cross_entropy.h). No torch and no CUDA type appears here.
#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

struct CrossEntropyArgs {
  const void* logits;  // [rows, width], row r at logits + r · ld
  ElemType type;
  long long rows, width;
  long long ld, gradLd;  // row strides (elements) of logits and grad, >= width
  const long long* targets;  // [rows] global ids
  long long start;           // this shard's first vocab id
  float* partials;           // partials: output [3, rows]
  const float* rowMax;       // grad: [rows] all-reduced max
  const float* sumExp;       // grad: [rows] all-reduced sum of exp(x - rowMax)
  const float* gOverN;       // grad: one float (device)
  void* grad;                // grad: output [rows, width], the logits' type
  bool vec;                  // width and row strides multiples of 16 bytes' elements, logits (and grad) 16-byte aligned
};
std::string launchCrossEntropyPartials(const CrossEntropyArgs& a, const Launch& l);
std::string launchCrossEntropyGrad(const CrossEntropyArgs& a, const Launch& l);

}  // namespace tessera::kernels::detail
