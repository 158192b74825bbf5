#pragma once
// Internal (kernels/ only): the launchers of the RMSNorm / LayerNorm kernels in norm_cuda.cu
// (math and contract in norm.h, the residual-add variants in add_norm.h). No torch and no CUDA
// type appears here.
#include <string>

#include "kernels/launch.h"

namespace tessera::kernels::detail {

struct NormForwardArgs {
  const void* x;
  ElemType xType;
  void* y;
  ElemType yType;
  const float* weight;  // [d]
  const float* bias;    // [d] or null
  float* mean;          // [rows] or null (RMSNorm)
  float* rstd;          // [rows]
  long long rows, d;
  float eps;
  bool centered;  // LayerNorm (subtract the mean); RMSNorm otherwise
  bool vec4;      // d % 4 == 0 and x, y, weight, bias (branch, s) aligned to 4 elements: 4-wide accesses
  // Residual add (add_norm.h), or null: s = x + branch, rounded to x's type, is written to `s`
  // and normalised instead of x.
  const void* branch;
  ElemType branchType;
  void* s;  // x's type
};
std::string launchNormForward(const NormForwardArgs& a, const Launch& l);

struct NormBackwardArgs {
  const void* gy;
  ElemType gyType;
  const void* x;
  ElemType xType;
  void* gx;  // x's type
  const float* weight;
  const float* mean;  // null for RMSNorm
  const float* rstd;
  float* gw;       // [d]
  float* gb;       // [d] or null: no bias gradient
  float* partial;  // workspace: [groups, d] (and another [groups, d] after it with gb)
  long long groups;
  long long rows, d;
  bool centered;
  bool vec4;  // as in the forward, for gy, x, gx, weight (gres, gbranch)
  // Residual gradient (add_norm.h), or null: gx = norm's gx + gres (x's type), rounded once.
  const void* gres;
  void* gbranch;  // or null: gx also stored in gbranchType (the branch's gradient in its dtype)
  ElemType gbranchType;
};
// How many row groups (blocks, partial rows) the backward uses on `device`.
long long normBackwardGroups(long long rows, int device);
std::string launchNormBackward(const NormBackwardArgs& a, const Launch& l);

}  // namespace tessera::kernels::detail
