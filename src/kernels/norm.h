#pragma once
// RMSNorm and LayerNorm over the last dimension d, forward and backward as separate calls (the
// autograd ops are nn::rmsNorm / nn::layerNorm, nn/fused_norm.h); every leading dimension is a row:
//   RMSNorm:   rstd = 1 / sqrt(mean(x²) + eps),  y = (x · rstd) · w
//   LayerNorm: rstd = 1 / sqrt(mean((x − mean)²) + eps),  y = ((x − mean) · rstd) · w + b
// Local, no communication. x contiguous [..., d], float32/bfloat16/float16; weight (and bias) [d]
// of any floating dtype on x's device, read as float32; y in `outDtype`; mean, rstd [rows] float32.
// Backward: gy of x's shape (any layout) in y's dtype; gx in x's dtype and shape, gw in the
// weight's dtype and gb in float32, both summed in float32. Anything else is a tessera::Error
// naming the op, the tensor, its shape, dtype and device. CPU tensors use the references (ATen in
// float32; the RMSNorm forward bitwise the model's ops); CUDA tensors one kernel per row block on
// the caller's current stream, no host synchronisation, deterministic.
// The backward formula and the kernels' bounds: docs/design/kernels.md.
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
