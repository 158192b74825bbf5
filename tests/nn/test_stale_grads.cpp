// nn/stale_grads.h on the CPU: a stale .grad (filled with NaN here, standing for the garbage it
// may hold) is replaced by the first writer, never added to: the weight and bias GEMMs overwrite
// it (the product alone, bitwise what a fresh .grad gets), the embedding zeroes it before adding
// its rows, later writers add as usual; each mark is resolved once, also inside a deferred W. The
// FP8 linear's weight-gradient GEMM (kernels/fp8.h's CPU reference on CPU tensors) overwrites too.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

#include "tessera/nn/accum_embedding.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/nn/stale_grads.h"
#include "parallel/tensor/fp8_linear.h"
#include "harness/multiprocess.h"

namespace {

using namespace tessera::nn;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A weight and bias whose .grad holds NaN and is marked stale.
struct StaleLinear {
  at::Tensor w = at::randn({5, 3}).requires_grad_(true), b = at::randn({5}).requires_grad_(true);
  StaleLinear() {
    w.mutable_grad() = at::full({5, 3}, kNaN);
    b.mutable_grad() = at::full({5}, kNaN);
    markStale({w, b});
  }
};

// The gradients of the same micro-batches into fresh (undefined) .grad.
std::pair<at::Tensor, at::Tensor> freshGrads(const StaleLinear& s, const std::vector<at::Tensor>& xs) {
  auto w = s.w.detach().clone().requires_grad_(true), b = s.b.detach().clone().requires_grad_(true);
  for (const auto& x : xs) linearAccumulateGrad(x, w, b).sum().backward();
  return {w.grad(), b.grad()};
}

}  // namespace

TEST(StaleGrads, TheFirstGemmOverwritesAndTheNextAdds) {
  torch::manual_seed(5);
  StaleLinear s;
  EXPECT_TRUE(isStale(s.w));
  EXPECT_EQ(staleCount(), 2u);
  const auto gradStorage = s.w.grad().data_ptr();
  std::vector<at::Tensor> xs = {at::randn({4, 3}), at::randn({2, 4, 3})};
  for (const auto& x : xs) linearAccumulateGrad(x, s.w, s.b).sum().backward();
  EXPECT_EQ(staleCount(), 0u);
  EXPECT_EQ(s.w.grad().data_ptr(), gradStorage) << "the stale .grad is written in place (DDP's bucket views)";
  auto [w, b] = freshGrads(s, xs);
  EXPECT_TRUE(at::equal(s.w.grad(), w)) << "weight: " << s.w.grad() << " against " << w;
  EXPECT_TRUE(at::equal(s.b.grad(), b)) << "bias: " << s.b.grad() << " against " << b;
}

TEST(StaleGrads, DeferredWeightGradsOverwriteWhenTheyRun) {
  torch::manual_seed(6);
  StaleLinear s;
  auto x = at::randn({3, 3});
  WeightGradQueue q;
  {
    DeferWeightGrads scope(q);
    linearAccumulateGrad(x, s.w, s.b).sum().backward();
  }
  EXPECT_EQ(staleCount(), 2u) << "nothing written before W runs";
  q.run();
  EXPECT_EQ(staleCount(), 0u);
  auto [w, b] = freshGrads(s, {x});
  EXPECT_TRUE(at::equal(s.w.grad(), w));
  EXPECT_TRUE(at::equal(s.b.grad(), b));
}

TEST(StaleGrads, EmbeddingZeroesTheRowsItDoesNotWrite) {
  torch::manual_seed(7);
  auto table = at::randn({8, 4}).requires_grad_(true);
  table.mutable_grad() = at::full({8, 4}, kNaN);
  markStale({table});
  auto ids = at::tensor({1, 3, 3}, at::kLong);
  embeddingAccumulateGrad(ids, table).sum().backward();
  EXPECT_FALSE(isStale(table));
  auto want = at::zeros({8, 4});
  want[1].fill_(1);
  want[3].fill_(2);
  EXPECT_TRUE(at::equal(table.grad(), want)) << table.grad();
}

TEST(StaleGrads, ZeroIfStaleResolvesOnceAndMarksOnlyDefinedGrads) {
  auto a = at::ones({3}).requires_grad_(true), none = at::ones({2}).requires_grad_(true);
  a.mutable_grad() = at::full({3}, 7.0);
  markStale({a, none});
  EXPECT_EQ(staleCount(), 1u) << "a parameter without .grad gets a fresh one from its first writer";
  markStale({a});
  EXPECT_EQ(staleCount(), 1u);
  zeroIfStale(std::vector<at::Tensor>{a, none});
  EXPECT_TRUE(at::equal(a.grad(), at::zeros({3})));
  a.mutable_grad().fill_(2.0);
  zeroIfStale(a);  // resolved already: no second zeroing
  EXPECT_TRUE(at::equal(a.grad(), at::full({3}, 2.0)));
  EXPECT_FALSE(takeStale(a));
}

// On one rank (a tensor-parallel group of one over Gloo): the FP8 linear, tensorwise, with its weight
// gradient summed into .grad by the FP8 GEMM, into a stale NaN .grad and into a fresh one.
TESSERA_WORKER(stale_fp8_linear) {
  auto ctx = tessera::testing::initWorker(w, tessera::Backend::Gloo);
  torch::manual_seed(8);
  const auto w0 = at::randn({32, 16}) * 0.1;
  auto stale = w0.clone().requires_grad_(true), fresh = w0.clone().requires_grad_(true);
  stale.mutable_grad() = at::full({32, 16}, kNaN);
  markStale({stale});
  const tessera::tp::Fp8LinearSpec spec{tessera::tp::Fp8Parallel::Column, ctx.world, false, /*accumulateGrad=*/true,
                                        tessera::fp8::Recipe::Tensorwise};
  for (int m = 0; m < 2; ++m) {
    const auto x = at::randn({16, 16});
    for (auto* p : {&stale, &fresh}) tessera::tp::fp8ParallelLinear(x, *p, {}, spec).sum().backward();
    WCHECK(at::equal(stale.grad(), fresh.grad()), "FP8 weight gradient after micro-batch {}: {} against {}", m,
           stale.grad().abs().max().item<double>(), fresh.grad().abs().max().item<double>());
  }
  WCHECK(staleCount() == 0, "{} marks left", staleCount());
}

TEST(StaleGrads, Fp8WeightGradGemmOverwrites) {
  tessera::testing::expectAllOk(tessera::testing::runWorkers("stale_fp8_linear", {.ranks = 1}));
}
