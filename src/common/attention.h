#pragma once
// Causal self-attention over [B, heads, T, headDim] tensors, the one place that picks the
// kernel: ATen's fused scaled_dot_product_attention where LibTorch has it (2.x: flash /
// memory-efficient kernels on GPUs, no [T, T] score matrix kept), else the explicit masked
// softmax (LibTorch 1.13). Both compute softmax(q kᵀ / sqrt(headDim) + causal mask) v.
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

namespace tessera {

inline at::Tensor causalSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto mask = at::triu(at::ones({t, t}, q.options().dtype(at::kBool)), 1);
  att = at::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  return at::matmul(att, v);
#endif
}

// The same with an explicit boolean mask [Tq, Tk] (true: the query may attend to the key), for
// queries that are not the first positions of the keys (context parallelism's chunks). Every
// query must see at least one key.
inline at::Tensor maskedSelfAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& allowed) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0, /*is_causal=*/false);
#else
  auto att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  att = at::softmax(att.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity()), -1);
  return at::matmul(att, v);
#endif
}

}  // namespace tessera
