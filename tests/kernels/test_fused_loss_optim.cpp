// The fused vocab-parallel cross-entropy's CPU path (kernels/cross_entropy.h's references inside
// tp::vocabParallelCrossEntropy(..., fused)) and the multi-tensor AdamW's (kernels/
// multi_tensor_adamw.h) against ATen:
// - the loss and the logits' gradient against at::cross_entropy with autograd, float32, odd N and
//   V, on one rank; the per-shard pieces of a vocab split in 2 and 3 (uneven widths: the kernels
//   take any shard), combined as the op combines them, against the same; enough rows that the
//   references' row chunks (2^22 elements) split the work; on 2 and 4 Gloo ranks the whole op
//   (two all-reduces) against the unfused op and at::cross_entropy.
//   Tolerance as test_fused_ops.cpp: float32 maths in another order, 1e-5 relative.
// - multiTensorAdamW on CPU tensors is adamwStepReference per tensor with the decay mask applied
//   (bitwise), its bf16 copies are the parameters rounded (bitwise); bad lists are errors naming
//   the list and the index.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fused_check.h"
#include "harness/multiprocess.h"
#include "kernels/cross_entropy.h"
#include "kernels/multi_tensor_adamw.h"
#include "tessera/parallel/tensor/vocab.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

void close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  expectClose(got, want, 1e-5, 1e-6 * want.abs().max().item<double>() + 1e-30, what);
}

// Loss and gradient of at::cross_entropy (mean) on the full logits, scaled by g.
std::pair<at::Tensor, at::Tensor> atenLoss(const at::Tensor& logits, const at::Tensor& targets, double g) {
  auto x = logits.detach().clone().requires_grad_();
  auto loss = at::cross_entropy_loss(x, targets);
  (loss * g).backward();
  return {loss.detach(), x.grad()};
}

// The op's combination of per-shard pieces (vocab.cpp's FusedVocabParallelCE), done by hand.
void checkShards(const at::Tensor& logits, const at::Tensor& targets, const std::vector<int64_t>& widths,
                 const std::string& what) {
  const int64_t n = logits.size(0);
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (int64_t w : widths) {
    parts.push_back(kernels::crossEntropyPartials(logits.narrow(1, start, w).contiguous(), targets, start));
    start += w;
  }
  auto m = parts[0][0].clone();
  for (const auto& p : parts) m = at::maximum(m, p[0]);
  auto s = at::zeros({n}), t = at::zeros({n});
  for (const auto& p : parts) {
    s += p[1] * (p[0] - m).exp();
    t += p[2];
  }
  const double g = 0.7;
  auto [wantLoss, wantGrad] = atenLoss(logits, targets, g);
  close((s.log() + m - t).mean(), wantLoss, what + ": loss");
  start = 0;
  const auto gOverN = at::scalar_tensor(g / static_cast<double>(n), at::kFloat);
  for (int64_t w : widths) {
    auto grad = kernels::crossEntropyGrad(logits.narrow(1, start, w).contiguous(), targets, start, m, s, gOverN);
    close(grad, wantGrad.narrow(1, start, w), fmt::format("{}: gradient of the shard at {}", what, start));
    start += w;
  }
}

TEST(FusedCrossEntropy, ShardPiecesMatchAtenCrossEntropy) {
  at::manual_seed(7);
  auto logits = at::randn({37, 53}) * 4;
  auto targets = at::randint(0, 53, {37}, at::kLong);
  checkShards(logits, targets, {53}, "one shard");
  checkShards(logits, targets, {26, 27}, "two shards");
  checkShards(logits, targets, {10, 20, 23}, "three uneven shards");
  // 130 rows of 65536: the references work through chunks of 64 rows (2^22 elements).
  auto big = at::randn({130, 65536}) * 3;
  auto bigTargets = at::randint(0, 65536, {130}, at::kLong);
  checkShards(big, bigTargets, {32768, 32768}, "chunked rows");
}

TEST(FusedCrossEntropy, PiecesOfExtremeLogitsStayFinite) {
  auto logits = at::tensor({1000.f, -1000.f, 0.f, -1e30f, -1e30f, 5.f}).view({2, 3});
  auto targets = at::tensor({0, 2}, at::kLong);
  auto p = kernels::crossEntropyPartials(logits, targets, 0);
  EXPECT_TRUE(at::isfinite(p).all().item<bool>()) << p;
  close(p[1], at::tensor({1.f, 1.f}), "sum of exp relative to the row max");
}

TEST(FusedCrossEntropy, BadInputsAreErrors) {
  auto l = at::randn({4, 6});
  EXPECT_NO_THROW(expectErrorContaining([&] { kernels::crossEntropyPartials(l, at::zeros({3}, at::kLong), 0); },
                                        {"crossEntropyPartials", "targets", "[3]"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { kernels::crossEntropyPartials(l.t(), at::zeros({6}, at::kLong), 0); },
                                        {"crossEntropyPartials", "logits", "contiguous"}));
}

// Every rank holds V/tp columns of the same logits; the fused op's loss and shard gradient equal
// the unfused op's and at::cross_entropy's.
TESSERA_WORKER(fused_ce_tp) {
  auto ctx = initWorker(w);
  const int tp = ctx.world->size(), r = ctx.world->rank();
  const int64_t n = 29, v = 12 * tp;
  at::manual_seed(11);  // the same full logits on every rank
  auto full = at::randn({n, v}) * 3;
  auto targets = at::randint(0, v, {n}, at::kLong);
  auto [wantLoss, wantGrad] = atenLoss(full, targets, 1.0);
  for (bool fused : {true, false}) {
    auto shard = full.narrow(1, r * 12, 12).clone().requires_grad_();
    auto loss = tp::vocabParallelCrossEntropy(shard, targets, ctx.world, v, fused);
    loss.backward();
    const double dl = std::abs(loss.item<double>() - wantLoss.item<double>());
    WCHECK(dl <= 1e-5 * std::abs(wantLoss.item<double>()), "rank {} fused {}: loss {} vs {}", r, fused,
           loss.item<double>(), wantLoss.item<double>());
    auto want = wantGrad.narrow(1, r * 12, 12);
    const double dg = (shard.grad() - want).abs().max().item<double>();
    WCHECK(dg <= 1e-5 * want.abs().max().item<double>(), "rank {} fused {}: gradient off by {}", r, fused, dg);
  }
  // gradInLogits: the same gradient, written over the logits (a non-leaf here, shard · 1, as the
  // model's head output is); backpropagating that loss a second time is autograd's error.
  auto shard = full.narrow(1, r * 12, 12).clone().requires_grad_();
  auto logits = shard * 1.0;
  auto loss = tp::vocabParallelCrossEntropy(logits, targets, ctx.world, v, true, /*gradInLogits=*/true);
  loss.backward({}, /*retain_graph=*/true);
  auto want = wantGrad.narrow(1, r * 12, 12);
  const double dg = (shard.grad() - want).abs().max().item<double>();
  WCHECK(dg <= 1e-5 * want.abs().max().item<double>(), "rank {} in place: gradient off by {}", r, dg);
  WCHECK(at::equal(logits.detach(), shard.grad()), "rank {}: the logits do not hold their gradient", r);
  std::string error;
  try {
    loss.backward();
  } catch (const std::exception& e) {
    error = e.what();
  }
  WCHECK(error.find("inplace") != std::string::npos, "rank {}: a second backward gave '{}'", r, error);
}

TEST(FusedCrossEntropy, VocabParallelOverGlooRanks) {
  for (int ranks : {2, 4}) expectAllOk(runWorkers("fused_ce_tp", {.ranks = ranks}));
}

TEST(FusedCrossEntropy, GradInPlaceIsTheGradient) {
  at::manual_seed(9);
  auto logits = at::randn({37, 53}) * 4;
  auto targets = at::randint(0, 53, {37}, at::kLong);
  auto p = kernels::crossEntropyPartials(logits, targets, 0);
  auto m = p[0].clone(), s = p[1].clone();
  const auto gOverN = at::scalar_tensor(0.7 / 37, at::kFloat);
  auto want = kernels::crossEntropyGrad(logits, targets, 0, m, s, gOverN);
  auto x = logits.clone();
  auto got = kernels::crossEntropyGradInPlace(x, targets, 0, m, s, gOverN);
  EXPECT_EQ(got.data_ptr(), x.data_ptr());
  EXPECT_TRUE(at::equal(got, want));
  auto notContiguous = logits.t().contiguous().t();
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::crossEntropyGradInPlace(notContiguous, targets, 0, m, s, gOverN); },
      {"crossEntropyGradInPlace", "contiguous rows"}));
}

// The first 53 columns of a [37, 64] buffer (train_gpt's logits of an odd vocabulary on GPUs):
// the same pieces and gradient as the contiguous logits; in place, the padding is left alone.
TEST(FusedCrossEntropy, PaddedRowsAreReadWhereTheyAre) {
  at::manual_seed(10);
  auto logits = at::randn({37, 53}) * 4;
  auto targets = at::randint(0, 53, {37}, at::kLong);
  auto buffer = at::full({37, 64}, 7.0f);
  auto padded = buffer.narrow(1, 0, 53);
  padded.copy_(logits);
  ASSERT_TRUE(kernels::rowsContiguous(padded));
  ASSERT_FALSE(padded.is_contiguous());
  auto p = kernels::crossEntropyPartials(logits, targets, 0);
  EXPECT_TRUE(at::equal(kernels::crossEntropyPartials(padded, targets, 0), p));
  auto m = p[0].clone(), s = p[1].clone();
  const auto gOverN = at::scalar_tensor(0.7 / 37, at::kFloat);
  auto want = kernels::crossEntropyGrad(logits, targets, 0, m, s, gOverN);
  EXPECT_TRUE(at::equal(kernels::crossEntropyGrad(padded, targets, 0, m, s, gOverN), want));
  auto got = kernels::crossEntropyGradInPlace(padded, targets, 0, m, s, gOverN);
  EXPECT_EQ(got.data_ptr(), buffer.data_ptr());
  EXPECT_TRUE(at::equal(got, want));
  EXPECT_TRUE(at::equal(buffer.narrow(1, 53, 11), at::full({37, 11}, 7.0f))) << "the padding was written";
}

// AdamW's lists of the given sizes (values spread over many binades), and twins to step apart.
struct AdamWLists {
  std::vector<at::Tensor> p, g, m, v, p2, g2, m2, v2;
};
AdamWLists adamwLists(const std::vector<int64_t>& sizes) {
  AdamWLists a;
  for (int64_t n : sizes) {
    a.p.push_back(at::randn({n}));
    a.g.push_back(spread({n}, -7, 1));
    a.m.push_back(spread({n}, -8, 0));
    a.v.push_back(spread({n}, -14, 2).abs());
    a.p2.push_back(a.p.back().clone());
    a.g2.push_back(a.g.back().clone());
    a.m2.push_back(a.m.back().clone());
    a.v2.push_back(a.v.back().clone());
  }
  return a;
}

TEST(MultiTensorAdamW, CpuIsThePerTensorReferenceWithTheDecayMask) {
  at::manual_seed(8);
  const std::vector<int64_t> sizes = {1, 0, 257, 4099, 3, 70000};
  const std::vector<bool> decay = {true, false, true, false, true, true};
  auto [p, g, m, v, p2, g2, m2, v2] = adamwLists(sizes);
  std::vector<at::Tensor> copies;
  for (int64_t n : sizes) copies.push_back(at::empty({n}, at::kBFloat16));
  for (int64_t step : {1, 2, 1000}) {
    const kernels::AdamWStep s{3e-4, 0.9, 0.95, 1e-8, 0.1, step};
    kernels::multiTensorAdamW(p, g, m, v, decay, s, copies);
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto si = s;
      if (!decay[i]) si.weightDecay = 0;
      kernels::adamwStepReference(p2[i], g[i], m2[i], v2[i], si);
      EXPECT_TRUE(at::equal(p[i], p2[i]) && at::equal(m[i], m2[i]) && at::equal(v[i], v2[i]))
          << "tensor " << i << " step " << step;
      EXPECT_TRUE(at::equal(copies[i], p[i].to(at::kBFloat16))) << "bf16 copy of tensor " << i;
    }
  }
}

// gradScale (clipping's coefficient on the device): the step on the gradients scaled first, bit
// for bit, and the gradients left as they were; a scale that is not one float32 value is an error.
TEST(MultiTensorAdamW, GradScaleIsTheStepOnScaledGradients) {
  at::manual_seed(9);
  const std::vector<int64_t> sizes = {5, 0, 4099};
  const std::vector<bool> decay = {true, false, true};
  auto [p, g, m, v, p2, g0, m2, v2] = adamwLists(sizes);
  const auto scale = at::full({1}, 0.3719f);
  for (int64_t step : {1, 7}) {
    const kernels::AdamWStep s{3e-4, 0.9, 0.95, 1e-8, 0.1, step};
    kernels::multiTensorAdamW(p, g, m, v, decay, s, {}, scale);
    std::vector<at::Tensor> g2;
    for (const auto& gi : g) g2.push_back(gi.mul(scale.reshape({})));
    kernels::multiTensorAdamW(p2, g2, m2, v2, decay, s);
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(at::equal(p[i], p2[i]) && at::equal(m[i], m2[i]) && at::equal(v[i], v2[i]))
          << "tensor " << i << " step " << step;
      EXPECT_TRUE(at::equal(g[i], g0[i])) << "tensor " << i << ": the gradient was written";
    }
  }
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::multiTensorAdamW(p, g, m, v, decay, {}, {}, at::ones({2})); },
      {"multiTensorAdamW", "gradScale", "one float32 value"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::multiTensorAdamW(p, g, m, v, decay, {}, {}, at::ones({1}, at::kDouble)); },
      {"multiTensorAdamW", "gradScale"}));
}

TEST(MultiTensorAdamW, BadListsAreErrors) {
  auto t = [] { return at::zeros({4}); };
  const kernels::AdamWStep s{};
  EXPECT_NO_THROW(expectErrorContaining([&] { kernels::multiTensorAdamW({t()}, {t(), t()}, {t()}, {t()}, {true}, s); },
                                        {"multiTensorAdamW", "1 params, 2 grads"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::multiTensorAdamW({t(), t()}, {t(), at::zeros({5})}, {t(), t()}, {t(), t()}, {true, true}, s); },
      {"multiTensorAdamW", "grads[1]", "4 elements", "[5]"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::multiTensorAdamW({t()}, {t()}, {t()}, {t()}, {true}, s, {at::zeros({4})}); },
      {"multiTensorAdamW", "bf16Copies[0]", "bfloat16"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { kernels::multiTensorAdamW({t()}, {t()}, {t()}, {t()}, {true}, {1e-3, 0.9, 0.999, 1e-8, 0, 0}); },
      {"multiTensorAdamW", "step 0"}));
}

}  // namespace
