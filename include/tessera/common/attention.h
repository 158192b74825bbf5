#pragma once
// Causal self-attention over [B, heads, T, headDim] tensors, the one place that picks the
// kernel: ATen's fused scaled_dot_product_attention where LibTorch has it (2.x: flash /
// memory-efficient kernels on GPUs, no [T, T] score matrix kept), else the explicit masked
// softmax (LibTorch 1.13). Both compute softmax(q kᵀ / sqrt(headDim) + causal mask) v.
//
// Grouped-query attention: k and v may have fewer heads than q (a divisor of q's); query head h
// reads kv head h / (heads / kvHeads). With `nativeGqa` and LibTorch 2.5 or later the fused
// kernels take the kv heads as they are (enable_gqa: cuDNN's and flash's kernels read each kv
// head for its query heads, and return its gradient summed), so no repeated copy of k and v is
// written, kept for backward or summed back; otherwise k and v are repeated here first.
#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <optional>

namespace tessera {

// x [B, h, T, D] → [B, h·rep, T, D], each head repeated rep times in place (head j → j·rep ..).
inline at::Tensor repeatKvHeads(const at::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, rep, t, d}).reshape({b, h * rep, t, d});
}

inline at::Tensor causalSelfAttention(const at::Tensor& q, at::Tensor k, at::Tensor v, bool nativeGqa = true) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) == v.size(1) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0,
              "causalSelfAttention: q [B, heads, T, D] and k, v [B, kvHeads, T, D] with kvHeads dividing heads; got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const int64_t rep = q.size(1) / k.size(1);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  if (rep > 1 && nativeGqa) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/std::nullopt, /*enable_gqa=*/true);
  }
#else
  (void)nativeGqa;
#endif
  k = repeatKvHeads(k, rep);
  v = repeatKvHeads(v, rep);
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
