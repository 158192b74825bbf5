#pragma once
// Rotary position embedding (RoPE) in the rotate-half layout (GPT-NeoX, Hugging Face Llama):
// a head's dimensions i and i + hd/2 form a pair rotated by position · inv_freq[i], with
// inv_freq[i] = theta^(-2i / hd), optionally rescaled as Llama 3.1+ does (RopeScaling).
// Local; autograd flows through the ATen ops (the rotation's backward is the inverse rotation).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::nn {

// Llama 3.1+'s rotary frequency scaling (rope_scaling "llama3").
struct RopeScaling {
  bool enabled = false;
  double factor = 8, lowFreqFactor = 1, highFreqFactor = 4;
  int64_t originalMaxPositions = 8192;
};

// inv_freq [hd / 2] (float64 CPU) with the scaling applied.
at::Tensor ropeInvFreq(int64_t headDim, double theta, const RopeScaling& scaling);

// cos and sin [T, hd] (each half repeated), float32, on `device`; cached per
// (T, hd, theta, scaling, device) after the first call (thread-safe).
struct RopeTables {
  at::Tensor cos, sin;
};
RopeTables ropeTables(int64_t seqLen, int64_t headDim, double theta, const RopeScaling& scaling, at::Device device);

// x [T, B, heads, hd] rotated by its position along dim 0 (positions 0 .. T-1), in x's dtype
// (computed in float32).
at::Tensor applyRope(const at::Tensor& x, const RopeTables& t);

// applyRope's rotation of the first `heads` heads of each token of a fused projection's output
// h [T, B, W] (rows [q | k | v], hd = the tables' width), as one autograd op (kernels/rotary.h:
// one CUDA kernel each way; the ATen reference on CPU, bitwise applyRope). The rotation is done
// in place in h's memory and the result is returned as a new autograd output that aliases it:
// h must be the projection's fresh output, read by nothing else afterwards (its old values are
// gone; a non-contiguous h is copied first). Backward: the inverse rotation of the q and k
// gradients, v's passed through (one pass). Local.
at::Tensor ropeQkInPlace(const at::Tensor& h, int64_t heads, const RopeTables& t);

}  // namespace tessera::nn
