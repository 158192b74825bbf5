#pragma once
// Internal (kernels/ only): the launchers of the SwiGLU and bias + GELU kernels in
// activations_cuda.cu (math and contract in activations.h). No torch and no CUDA type here.
#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

// SwiGLU over rows of h [rows, 2F] ([gate | up]) and y / gy [rows, F], all of `type`.
struct SwigluArgs {
  const void* h;
  void* y;         // forward output
  const void* gy;  // backward input
  void* gh;        // backward output [rows, 2F]
  ElemType type;
  long long rows, ffn;
  bool vec4;  // ffn % 4 == 0 and every pointer aligned to 4 elements
};
std::string launchSwigluForward(const SwigluArgs& a, const Launch& l);
std::string launchSwigluBackward(const SwigluArgs& a, const Launch& l);

// bias + GELU over h, y, gy, gh [rows, ffn] of `type`; bias float32 [ffn].
struct BiasGeluArgs {
  const void* h;
  const float* bias;
  void* y;
  const void* gy;
  void* gh;
  float* partial;  // backward workspace [groups, ffn]
  float* gb;       // backward output [ffn]
  long long groups;
  ElemType type;
  long long rows, ffn;
  bool vec4;  // ffn % 4 == 0 and every pointer aligned to 4 elements
};
// How many row groups (partial rows) the backward uses on `device`.
long long biasGeluGroups(long long rows, long long ffn, int device);
std::string launchBiasGeluForward(const BiasGeluArgs& a, const Launch& l);
std::string launchBiasGeluBackward(const BiasGeluArgs& a, const Launch& l);

}  // namespace tessera::kernels::detail
