// nn::embeddingAccumulateGrad on the CPU against at::embedding trained by autograd (its own copy
// of the weight): outputs bitwise, the weight gradient summed over micro-batches that repeat ids
// (within a micro-batch and across them), an existing .grad added to, grad mode off, and the
// errors for what it cannot take (the harness's expectErrorContaining, which throws when the
// error is missing). The CUDA path is in test_accum_linear_gpu.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <string>

#include "harness/multiprocess.h"
#include "tessera/nn/accum_embedding.h"

namespace {

using tessera::nn::embeddingAccumulateGrad;

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, 1e-6, 1e-6)) << what << ": max diff " << (got - want).abs().max().item<double>();
}

}  // namespace

TEST(AccumEmbedding, MatchesAutogradOverMicroBatches) {
  torch::manual_seed(4);
  const int64_t vocab = 11, dim = 6;
  auto mine = at::randn({vocab, dim}).requires_grad_(true);
  auto ref = mine.detach().clone().requires_grad_(true);
  for (int m = 0; m < 4; ++m) {
    torch::manual_seed(50 + m);
    // [2, 7] ids from a range smaller than the vocabulary: rows repeat, some are never used.
    auto ids = at::randint(0, vocab - 3, {2, 7}, at::kLong);
    if (m == 2) ids = ids.to(at::kInt);
    auto probe = at::randn({2, 7, dim});
    auto y1 = embeddingAccumulateGrad(ids, mine);
    auto y2 = at::embedding(ref, ids);
    EXPECT_TRUE(at::equal(y1, y2)) << "forward, micro-batch " << m;
    (y1 * probe).sum().backward();
    (y2 * probe).sum().backward();
    expectClose(mine.grad(), ref.grad(), "weight gradient after micro-batch " + std::to_string(m));
  }
  // Rows no micro-batch touched keep a zero gradient.
  EXPECT_TRUE(mine.grad().narrow(0, vocab - 3, 3).eq(0).all().item<bool>());
}

TEST(AccumEmbedding, ExistingGradIsAddedTo) {
  auto w = at::zeros({4, 3}).requires_grad_(true);
  w.mutable_grad() = at::full({4, 3}, 0.5);
  auto ids = at::tensor({1, 1, 3}, at::kLong);
  embeddingAccumulateGrad(ids, w).sum().backward();
  auto want = at::full({4, 3}, 0.5);
  want[1] += 2;  // row 1 looked up twice
  want[3] += 1;
  expectClose(w.grad(), want, "weight gradient added to an existing .grad");
}

TEST(AccumEmbedding, WithoutGradModeOrFrozenIsEmbedding) {
  auto w = at::randn({5, 2}).requires_grad_(true);
  auto ids = at::tensor({0, 4, 2}, at::kLong);
  {
    at::NoGradGuard ng;
    auto y = embeddingAccumulateGrad(ids, w);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(at::equal(y, at::embedding(w, ids)));
  }
  auto frozen = at::randn({5, 2});
  EXPECT_FALSE(embeddingAccumulateGrad(ids, frozen).requires_grad());
}

TEST(AccumEmbedding, RefusesWhatItCannotTake) {
  using tessera::testing::expectErrorContaining;
  auto w = at::randn({5, 2}).requires_grad_(true);
  expectErrorContaining([&] { embeddingAccumulateGrad(at::tensor({0.5f, 1.0f}), w); }, {"got ids [2] float32"});
  expectErrorContaining(
      [&] { embeddingAccumulateGrad(at::tensor({1}, at::kLong), at::randn({5}).requires_grad_(true)); }, {"weight [5]"});
  auto w64 = at::randn({5, 2}, at::kDouble).requires_grad_(true);
  expectErrorContaining([&] { embeddingAccumulateGrad(at::tensor({1}, at::kLong), w64); },
                        {"nn::embeddingAccumulateGrad: the weight must be a float32 leaf"});
  auto wt = at::randn({5, 2}).requires_grad_(true);
  wt.mutable_grad() = at::zeros({2, 5}).t();
  expectErrorContaining([&] { embeddingAccumulateGrad(at::tensor({1}, at::kLong), wt); }, {"not contiguous"});
}

// An untracked lookup with a row-gradient sink takes a weight of any floating dtype (FSDP's bf16
// views): the sink gets every row. Rows it declines are summed into .grad, which a bf16 weight
// cannot take: the error names the op, found at the backward that sums them.
TEST(AccumEmbedding, SinkTakesBf16RowsAndDeclinedOnesAreChecked) {
  using tessera::testing::expectErrorContaining;
  auto w = at::randn({5, 2}).to(at::kBFloat16).requires_grad_(true);
  auto ids = at::tensor({1, 3, 1}, at::kLong);
  bool take = true;
  at::Tensor got;
  tessera::nn::setRowGradSink(w, [&](const at::Tensor& i, const at::Tensor& rows) {
    got = rows;
    return take;
  });
  embeddingAccumulateGrad(ids, w, /*untracked=*/true).sum().backward();
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(w.grad().defined()) << "the sink took the rows: nothing is summed into .grad";
  take = false;
  expectErrorContaining([&] { embeddingAccumulateGrad(ids, w, /*untracked=*/true).sum().backward(); },
                        {"nn::embeddingAccumulateGrad: the weight must be a float32 leaf", "bfloat16"});
  tessera::nn::setRowGradSink(w, {});
}
