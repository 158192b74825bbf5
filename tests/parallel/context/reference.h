#pragma once
// The single-process reference of the context-parallel attention tests: causal attention over
// the whole sequence, each kv head repeated for its query heads (q [T, B, Hq, D], k and v
// [T, B, Hkv, D], Hq a multiple of Hkv) → [T, B, Hq, D], through common/attention.h.
#include <ATen/ATen.h>

#include "tessera/common/attention.h"

namespace tessera::testing {

inline at::Tensor causalReference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto heads = [](const at::Tensor& x, int64_t rep) {
    auto y = x.permute({1, 2, 0, 3});
    return rep == 1 ? y : y.repeat_interleave(rep, 1);
  };
  const int64_t rep = q.size(2) / k.size(2);
  return causalSelfAttention(heads(q, 1), heads(k, rep), heads(v, rep)).permute({2, 0, 1, 3});
}

}  // namespace tessera::testing
