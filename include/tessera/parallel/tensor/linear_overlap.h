#pragma once
// tp::columnLinearAsyncGrad: the column-parallel linear as one autograd op whose backward overlaps
// the input-gradient collective with the weight-gradient GEMM (Megatron-LM's
// LinearWithGradAccumulationAndAsyncCommunication); LinearOverlap, the overlap options of every
// tensor-parallel linear.
//   fwd: (sequenceParallel: all-gather dim 0 of x)  then  y = x Wᵀ + b
//   bwd: gx = gy W;  all-reduce(gx) over tp (sequenceParallel: reduce-scatter dim 0), launched
//        before gW = gyᵀ x, gb = Σ gy and waited for after them;  return gx (or its token shard).
// Collective over tp in forward (sequenceParallel only) and in backward: every rank of the group
// runs the same forward and the same backward. A group of one is a plain at::linear.
// Streams: each collective runs on the communicator's stream after the work queued on the caller's
// current stream, the GEMMs queue on the current stream meanwhile, and Work::wait() makes the
// current stream wait (no host sync). On CPU (Gloo) the collective runs on the communicator's
// thread. x, W, b: any dtypes at::linear takes; gradients come back in each input's dtype.
// Why, and what was measured: docs/design/tensor_parallel.md.
#include <ATen/core/Tensor.h>

#include <functional>

#include "tessera/comm/communicator.h"
#include "tessera/comm/settings.h"
#include "tessera/fp8/fake_quant.h"

namespace tessera::tp {

// Called (on the thread running backward) after each step of the overlapped backward, with
// "grad_input" (the gx GEMM was issued) and "grad_weight" (the gW/gb GEMMs were issued).
// For tests and profiling; may be empty.
using LinearBackwardTrace = std::function<void(const char* event)>;

// How a tensor-parallel linear overlaps its collectives with its GEMMs.
struct LinearOverlap {
  // Forward pieces: a row-parallel layer computes its output in this many pieces and starts
  // each piece's all-reduce (reduce-scatter) at once; a column-parallel layer with sequence
  // parallel gathers its input in this many pieces. 1: one GEMM then one collective.
  int forwardChunks = 1;
  // SMs kept free of GEMMs that run beside a collective (GPUs, LibTorch >= 2.7; 0: none).
  int smCarveout = 0;
  // A row-parallel layer's forward reduction by a ring of point-to-point transfers, each
  // beside the GEMM of the next token shard (row_linear.h); instead of forward pieces. Needs
  // the rows divisible by the group's size (else the pieces' path is taken).
  bool ring = false;

  // The process's choice (TESSERA_TP_FORWARD_CHUNKS, TESSERA_OVERLAP_SM_CARVEOUT,
  // TESSERA_TP_RING), for the top of a program to pass to its layers.
  static LinearOverlap fromSettings(const Settings& s) { return {s.tpForwardChunks, s.smCarveout, s.tpRing}; }
};

// x: [..., in] replicated over tp, or [tokens/tp, ..., in] with sequenceParallel;
// weight: [outLocal, in]; bias: [outLocal] or undefined. Returns [..., outLocal]
// ([tokens, ..., outLocal] with sequenceParallel). accumulateGrad: the weight and bias gradients
// are summed in float32 straight into their .grad by the GEMM (nn/accum_linear.h; the caller
// checks the parameters first) and not returned. fp8: the recipe's GEMMs on FP8 operands
// (fp8/fake_quant.h; the CPU emulation), scaled as the unsharded layer's would be (amaxes
// all-reduced over tp where this rank holds a slice), also in a group of one.
at::Tensor columnLinearAsyncGrad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const CommPtr& tp, bool sequenceParallel, LinearOverlap overlap = {},
                                 LinearBackwardTrace trace = {}, bool accumulateGrad = false,
                                 fp8::Recipe fp8 = fp8::Recipe::Off);

}  // namespace tessera::tp
