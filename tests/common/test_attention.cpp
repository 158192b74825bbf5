// common/attention.h's grouped-query attention: kv heads repeated in place (head j feeds query heads
// j·rep ..), the result against softmax(q kᵀ / sqrt(D) + causal mask) v written out per query head
// with its kv head (CPU). The GPU side (the fused kernel reading the kv heads) is
// tests/nn/test_attention_gpu.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "tessera/common/attention.h"

namespace {

at::Tensor byHand(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t heads = q.size(1), rep = heads / k.size(1), t = q.size(2);
  auto mask = at::triu(at::ones({t, t}, at::kBool), 1);
  std::vector<at::Tensor> out;
  for (int64_t h = 0; h < heads; ++h) {
    auto kh = k.select(1, h / rep), vh = v.select(1, h / rep), qh = q.select(1, h);
    auto s = at::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
    out.push_back(at::matmul(at::softmax(s.masked_fill(mask, -INFINITY), -1), vh));
  }
  return at::stack(out, 1);
}

}  // namespace

TEST(Attention, RepeatKvHeadsFeedsConsecutiveQueryHeads) {
  auto k = at::arange(2 * 3 * 1 * 1, at::kFloat).view({2, 3, 1, 1});
  auto r = tessera::repeatKvHeads(k, 2);
  ASSERT_EQ(r.sizes(), at::IntArrayRef({2, 6, 1, 1}));
  for (int64_t h = 0; h < 6; ++h) EXPECT_TRUE(at::equal(r.select(1, h), k.select(1, h / 2))) << "head " << h;
  EXPECT_TRUE(tessera::repeatKvHeads(k, 1).is_same(k));
}

TEST(Attention, GroupedQueryAttentionMatchesPerHeadMaths) {
  torch::manual_seed(9);
  auto q = at::randn({2, 8, 5, 4}), k = at::randn({2, 2, 5, 4}), v = at::randn({2, 2, 5, 4});
  for (bool native : {true, false}) {
    auto got = tessera::causalSelfAttention(q, k, v, native);
    EXPECT_TRUE(at::allclose(got, byHand(q, k, v), 1e-5, 1e-6)) << "native " << native;
  }
}
