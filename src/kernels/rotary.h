#pragma once
// Rotary position embedding (nn/rope.h's rotate-half layout and tables) on the q and k heads of
// a fused qkv projection's output, in place (the autograd op is nn::ropeQkInPlace).
//
// h [T, B, W] is contiguous, float32/bfloat16/float16, and each token's row starts with the
// `heads` heads to rotate (q's then k's, headDim each: heads · headDim <= W; the rest, v, is left
// alone). Token t (dim 0) is at position t. cos and sin are [>= T, headDim] float32 tables of
// h's device (nn::ropeTables: each half repeated), contiguous. For each head's pair
// (a, b) = (x_i, x_{i + headDim/2}), with c, s the tables' entries [t, i]:
//   forward (in place):   a' = a·c + (−b)·s,   b' = b·c + a·s          (computed in float32)
//   backward (new tensor): ga = ga'·c + gb'·s,  gb = gb'·c + (−ga')·s   (the inverse rotation; the
//                          rest of each row, v's gradient, copied)
// in h's dtype (each value rounded once from float32): nn::applyRope's ops in the same order, so
// the reference equals it bitwise. Shapes, dtypes or devices that do not fit are a
// tessera::Error naming the op and the tensor. Local; CPU tensors use the reference (ATen ops);
// CUDA tensors one kernel on the caller's current stream (no host synchronisation).
#include <ATen/core/Tensor.h>

namespace tessera::kernels {

void ropeInPlace(const at::Tensor& h, int64_t heads, int64_t headDim, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor ropeBackward(const at::Tensor& gh, int64_t heads, int64_t headDim, const at::Tensor& cos,
                        const at::Tensor& sin);

void ropeInPlaceReference(const at::Tensor& h, int64_t heads, int64_t headDim, const at::Tensor& cos,
                          const at::Tensor& sin);
at::Tensor ropeBackwardReference(const at::Tensor& gh, int64_t heads, int64_t headDim, const at::Tensor& cos,
                                 const at::Tensor& sin);

}  // namespace tessera::kernels
