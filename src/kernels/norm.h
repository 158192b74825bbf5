#pragma once
// RMSNorm and LayerNorm over the last dimension, forward and backward as separate calls (the
// autograd ops are nn::rmsNorm / nn::layerNorm, nn/fused_norm.h). One row is x's last
// dimension d; every leading dimension is a row.
//
//   RMSNorm:   rstd = 1 / sqrt(mean(x²) + eps),           y = (x · rstd) · w
//   LayerNorm: mean = mean(x), rstd = 1 / sqrt(mean((x − mean)²) + eps),
//              y = ((x − mean) · rstd) · w + b
//   backward (x̂ = (x − mean) · rstd, g' = gy · w; RMSNorm: mean = 0 and no mean(g') term):
//              gx = (g' − mean(g') − x̂ · mean(g' · x̂)) · rstd,   gw = Σ_rows gy · x̂,   gb = Σ_rows gy
//
// Contract (local, no communication): x is contiguous [..., d], float32/bfloat16/float16;
// weight (and bias) [d] of any floating dtype, on x's device (read as float32); y comes out in
// `outDtype` (float32/bfloat16/float16; the ops pass x's dtype, or CUDA autocast's dtype under
// autocast, so the next GEMM needs no cast). The statistics (mean, rstd: [rows] float32) are
// what backward takes. Backward: gy of x's shape (any layout) in y's dtype; gx comes out in x's
// dtype and shape, gw in the weight's dtype and gb in float32, both summed in float32. Anything else is a
// tessera::Error naming the op, the tensor, its shape, dtype and device.
// CPU tensors use the reference (ATen ops, in float32; the RMSNorm forward is the model's own
// sequence of ops, bitwise). CUDA tensors (builds with CUDA): one kernel per row block on the
// caller's current stream, no host synchronisation; backward reduces gw (gb) per block in the
// same pass and sums the blocks' partials in a second small kernel (a fixed order:
// deterministic). The kernels sum in another order than ATen: results agree within float32
// rounding of the sums (tests/kernels/test_fused_ops_gpu.cpp states the bounds).
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

enum class NormKind { Rms, Layer };

struct NormOutput {
  at::Tensor y;
  at::Tensor mean, rstd;  // [rows] float32; mean undefined for RMSNorm
};

struct NormGrads {
  at::Tensor gx, gw, gb;  // gb undefined unless asked for (LayerNorm with a bias)
};

// bias: LayerNorm only, may be undefined (then y has no + b and backward no gb).
NormOutput normForward(NormKind kind, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       double eps, c10::ScalarType outDtype);
// stats: the forward's mean (LayerNorm) and rstd. biasGrad: also compute gb.
NormGrads normBackward(NormKind kind, const at::Tensor& gy, const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad);

// The references (ATen ops, any device): what CPU tensors use and the GPU tests compare with.
NormOutput normForwardReference(NormKind kind, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                double eps, c10::ScalarType outDtype);
NormGrads normBackwardReference(NormKind kind, const at::Tensor& gy, const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad);

}  // namespace tessera::kernels
