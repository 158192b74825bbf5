#pragma once
// tp::fp8ParallelLinear: the tensor-parallel linears' FP8 path on CUDA tensors
// (ParallelLinearOptions::fp8 on a GPU): each GEMM on FP8 codes through cuBLASLt (kernels/fp8.h),
// with fp8/fake_quant.h's recipes and every amax taken over the whole, unsharded tensor
// (all-reduced, MAX, over tp where the tensor is split along it): the CPU emulation's maths.
//   Column (x [..., in], W [out/tp, in]): y = x Wᵀ; gx all-reduced over tp (sequence parallel:
//     x's token shards cast, their codes all-gathered; gx reduce-scattered).
//   Row (x [..., in/tp], W [out, in/tp]): y = Σ_tp x Wᵀ, all-reduced (sequence parallel:
//     reduce-scattered; the output gradient's codes all-gathered in backward).
// Collective over tp in forward and backward (a group of one: local); no overlap with the GEMMs.
// accumulateGrad: the weight gradient is added into weight.grad (float32) by the GEMM (recorded
// inside nn::DeferWeightGrads). Every GEMM dimension must be a multiple of 16 on CUDA, else a
// tessera::Error naming the shape. CPU tensors run this same code on kernels/fp8.h's CPU reference
// (how CI tests it). The recipes, what backward keeps, why: docs/design/tensor_parallel.md.
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"
#include "tessera/fp8/fake_quant.h"

namespace tessera::tp {

enum class Fp8Parallel { Column, Row };

struct Fp8LinearSpec {
  Fp8Parallel kind = Fp8Parallel::Column;
  CommPtr tp;
  bool sequenceParallel = false;
  bool accumulateGrad = false;
  fp8::Recipe recipe = fp8::Recipe::Tensorwise;
};

at::Tensor fp8ParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const Fp8LinearSpec& spec);

}  // namespace tessera::tp
