#pragma once
// The tensor-parallel linears' FP8 path on CUDA tensors (ParallelLinearOptions::fp8 on a GPU):
// each of the three GEMMs of a linear on FP8 codes through cuBLASLt (kernels/fp8.h), with the
// recipes of fp8/fake_quant.h (tensorwise: forward, input and weight gradient in FP8, x and W E4M3,
// the output gradient E5M2; rowwise: forward and input gradient in FP8 with per-row scales along
// each GEMM's reduction, the weight gradient in the input precision) and every amax taken over the
// whole, unsharded tensor (all-reduced, MAX, over tp where the tensor is split along it): the
// maths of the CPU emulation, which the GPU tests check this against.
//
//   Column (x [..., in] whole, W [out/tp, in]): y = x Wᵀ; gx all-reduced over tp (sequence
//     parallel: x's token shards are cast first and their codes all-gathered, half a bf16 gather;
//     gx reduce-scattered).
//   Row (x [..., in/tp], W [out, in/tp]): y = Σ_tp x Wᵀ, all-reduced (sequence parallel:
//     reduce-scattered; the output gradient's codes all-gathered in backward).
//
// Saved for backward: xᵀ's codes (tensorwise; one byte per value) or x (rowwise), the weight
// itself (its codes are recast in backward from the forward's amaxes, so a sharded weight is not
// held as codes between the passes). Collectives are not overlapped with the GEMMs here (the
// bf16 layers' chunked overlap is not ported). accumulateGrad: the weight gradient is added into
// weight.grad (float32) by the GEMM, deferred inside nn::DeferWeightGrads (zero-bubble's W).
// Collective over tp in forward and backward (a group of one: local). Every GEMM dimension must
// be a multiple of 16 on CUDA (cuBLASLt's FP8 kernels): else a tessera::Error naming the shape.
// The layers call this for CUDA tensors (on the CPU they run fp8/fake_quant.h's emulation); CPU
// tensors run this same code on kernels/fp8.h's CPU reference, which is how CI tests it.
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"
#include "fp8/fake_quant.h"

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
