// The test models themselves: shapes, determinism from a seed, batch helpers, and that a few
// SGD steps lower the loss (so the DDP/FSDP tests that use them compare meaningful training).
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "models/tiny_models.h"

using namespace tessera::testing;

namespace {

void expectSameParams(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = namedParameters(a), pb = namedParameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second)) << pa[i].first;
  }
}

template <typename Step>
std::vector<double> trainLosses(torch::nn::Module& m, int steps, double lr, Step step) {
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(lr));
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    torch::Tensor loss = step();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace

TEST(TinyMlp, ShapesAndNames) {
  auto m = makeTinyMlp(1);
  auto b = mlpBatch(7, 0, 5);
  EXPECT_EQ(b.x.sizes(), (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(m->forward(b.x).sizes(), (std::vector<int64_t>{5, 4}));
  auto names = namedParameters(*m);
  ASSERT_EQ(names.size(), 6u);
  EXPECT_EQ(names[0].first, "fc1.weight");
  EXPECT_EQ(names[5].first, "fc3.bias");
}

TEST(TinyMlp, SameSeedSameParams) {
  auto a = makeTinyMlp(3), b = makeTinyMlp(3), c = makeTinyMlp(4);
  expectSameParams(*a, *b);
  EXPECT_FALSE(torch::equal(a->fc1->weight, c->fc1->weight));
}

TEST(TinyMlp, SkipLeavesFc2WithoutGrad) {
  auto m = makeTinyMlp(1);
  m->skipFc2 = true;
  auto b = mlpBatch(7, 0, 4);
  mlpLoss(m->forward(b.x), b.y).backward();
  EXPECT_FALSE(m->fc2->weight.grad().defined());
  EXPECT_TRUE(m->fc1->weight.grad().defined());
  EXPECT_TRUE(m->fc3->weight.grad().defined());
}

TEST(TinyMlp, LossDecreases) {
  auto m = makeTinyMlp(1);
  auto b = mlpBatch(7, 0, 16);
  auto losses = trainLosses(*m, 10, 0.05, [&] { return mlpLoss(m->forward(b.x), b.y); });
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());
}

TEST(Batches, DeterministicPerRankAndConcatenated) {
  auto a = mlpBatch(5, 1, 3), b = mlpBatch(5, 1, 3), c = mlpBatch(5, 0, 3);
  EXPECT_TRUE(torch::equal(a.x, b.x));
  EXPECT_FALSE(torch::equal(a.x, c.x));
  auto all = concatMlpBatches(5, 3, 3);
  EXPECT_EQ(all.x.size(0), 9);
  EXPECT_TRUE(torch::equal(all.x.slice(0, 3, 6), a.x));
  EXPECT_TRUE(torch::equal(all.y.slice(0, 0, 3), c.y));
  auto g = gptBatch(5, 2, 2), gall = concatGptBatches(5, 3, 2);
  EXPECT_TRUE(torch::equal(gall.tokens.slice(0, 4, 6), g.tokens));
  EXPECT_TRUE(torch::equal(gall.targets.slice(0, 4, 6), g.targets));
  EXPECT_GE(g.tokens.min().item<int64_t>(), 0);
  EXPECT_LT(g.tokens.max().item<int64_t>(), 64);
}

TEST(TinyGpt, ShapesAndParams) {
  TinyGptOptions o;
  auto m = makeTinyGpt(1, o);
  auto b = gptBatch(9, 0, 3, o);
  auto logits = m->forward(b.tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 64}));
  const int64_t d = o.d, v = o.vocab;
  int64_t expect = v * d + o.seqLen * d + o.layers * (12 * d * d + 13 * d) + 2 * d + d * v;
  int64_t n = 0;
  for (auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, expect);
  // Own parameters first, then submodules' (as torch::nn and Python's nn.Module list them).
  EXPECT_EQ(namedParameters(*m)[0].first, "pos");
  EXPECT_EQ(namedParameters(*m)[1].first, "tok.weight");
  EXPECT_EQ(namedParameters(*m).back().first, "head.weight");
}

TEST(TinyGpt, Causal) {
  // Changing the last token must not change the logits of earlier positions.
  auto m = makeTinyGpt(2);
  auto b = gptBatch(9, 0, 1);
  auto t2 = b.tokens.clone();
  t2[0][15] = (t2[0][15].item<int64_t>() + 1) % 64;
  torch::NoGradGuard ng;
  auto l1 = m->forward(b.tokens), l2 = m->forward(t2);
  EXPECT_TRUE(torch::allclose(l1.slice(1, 0, 15), l2.slice(1, 0, 15)));
  EXPECT_FALSE(torch::allclose(l1.slice(1, 15, 16), l2.slice(1, 15, 16)));
}

TEST(TinyGpt, SameSeedSameParamsAndLossDecreases) {
  auto a = makeTinyGpt(5), b = makeTinyGpt(5);
  expectSameParams(*a, *b);
  auto batch = gptBatch(11, 0, 4);
  auto l0 = gptLoss(a->forward(batch.tokens), batch.targets).item<double>();
  EXPECT_NEAR(l0, std::log(64.0), 0.3);  // near-uniform predictions at init
  auto losses = trainLosses(*a, 8, 0.5, [&] { return gptLoss(a->forward(batch.tokens), batch.targets); });
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front() - 0.05);
}
