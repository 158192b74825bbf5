#pragma once
// Internal (kernels/ only): the launcher of the rotary kernel in rotary_cuda.cu (math and
// contract in rotary.h). No torch and no CUDA type appears here.
#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

struct RopeArgs {
  const void* in;  // [tokens, batch, width]
  void* out;       // the same (forward, in place) or another such tensor (backward)
  ElemType type;
  const float* cos;  // [>= tokens, headDim]
  const float* sin;
  long long tokens, batch, width;
  int heads, headDim;
  bool inverse;  // backward: rotate by −angle and copy the rest of each row into out
  bool vec2;     // headDim / 2 even, width even and in, out aligned to 2 elements: pairs of pairs
};
std::string launchRope(const RopeArgs& a, const Launch& l);

}  // namespace tessera::kernels::detail
