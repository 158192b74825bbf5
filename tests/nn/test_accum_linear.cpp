// nn::linearAccumulateGrad on the CPU against at::linear trained by autograd (its own copy of the
// parameters): outputs, input gradients and the parameters' gradients summed over several
// micro-batches; frozen weight, no bias, grad mode off; the errors for what it cannot accumulate
// into. kernels::gemmAccumulateTN's reference against a plain matrix product. Inside a
// DeferWeightGrads scope (a zero-bubble pipeline's B) the weight and bias gradients wait for the
// queue's run (W) and then equal the undeferred ones bitwise.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/gemm_accumulate.h"
#include "nn/accum_hook_check.h"
#include "tessera/common/error.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/nn/grad_sink.h"

namespace {

using tessera::nn::linearAccumulateGrad;

struct Params {
  at::Tensor w, b;
};

Params makeParams(int64_t out, int64_t in, bool bias, bool wGrad = true) {
  torch::manual_seed(3);
  Params p{at::randn({out, in}).requires_grad_(wGrad), bias ? at::randn({out}).requires_grad_(true) : at::Tensor()};
  return p;
}

Params copyOf(const Params& p) {
  return {p.w.detach().clone().requires_grad_(p.w.requires_grad()),
          p.b.defined() ? p.b.detach().clone().requires_grad_(true) : at::Tensor()};
}

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  // fp32 sums in another order: a few ulps of the largest terms.
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << what << ": max diff " << (got - want).abs().max().item<double>();
}

// Micro-batches of x [2, 5, in] (a 3-D input, as a transformer's), a loss weighting each output.
void runCase(bool bias, bool wGrad, int micro) {
  const int64_t out = 6, in = 4;
  auto mine = makeParams(out, in, bias, wGrad);
  auto ref = copyOf(mine);
  for (int m = 0; m < micro; ++m) {
    torch::manual_seed(100 + m);
    auto x = at::randn({2, 5, in});
    auto probe = at::randn({2, 5, out});
    auto x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);
    auto y1 = linearAccumulateGrad(x1, mine.w, mine.b);
    auto y2 = at::linear(x2, ref.w, ref.b.defined() ? c10::optional<at::Tensor>(ref.b) : c10::nullopt);
    EXPECT_TRUE(at::equal(y1, y2)) << "forward, micro-batch " << m;
    (y1 * probe).sum().backward();
    (y2 * probe).sum().backward();
    expectClose(x1.grad(), x2.grad(), "input gradient, micro-batch " + std::to_string(m));
    expectClose(mine.w.grad(), ref.w.grad(), "weight gradient after micro-batch " + std::to_string(m));
    if (bias) expectClose(mine.b.grad(), ref.b.grad(), "bias gradient after micro-batch " + std::to_string(m));
  }
  if (!wGrad) EXPECT_FALSE(mine.w.grad().defined());
}

}  // namespace

TEST(AccumLinear, MatchesAutogradOverMicroBatches) { runCase(/*bias=*/true, /*wGrad=*/true, 4); }
TEST(AccumLinear, NoBias) { runCase(false, true, 3); }
TEST(AccumLinear, FrozenWeightStillTrainsBiasAndInput) { runCase(true, false, 2); }

TEST(AccumLinear, GradAccumulatorHooksStillFire) { tessera::testing::checkHooksSeeAccumulatedGrads(at::kCPU); }

TEST(AccumLinear, ExistingGradIsAddedTo) {
  auto p = makeParams(3, 2, true);
  p.w.mutable_grad() = at::full({3, 2}, 0.5);
  auto x = at::randn({4, 2});
  linearAccumulateGrad(x, p.w, p.b).sum().backward();
  // d/dW of Σ (x Wᵀ) = column sums of x for every output row; plus the 0.5 already there.
  auto want = x.sum(0).expand({3, 2}) + 0.5;
  expectClose(p.w.grad(), want, "weight gradient added to an existing .grad");
  expectClose(p.b.grad(), at::full({3}, 4.0), "bias gradient");
}

TEST(AccumLinear, WithoutGradModeIsLinear) {
  auto p = makeParams(3, 2, true);
  auto x = at::randn({4, 2});
  at::NoGradGuard ng;
  auto y = linearAccumulateGrad(x, p.w, p.b);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(at::equal(y, at::linear(x, p.w, p.b)));
}

// A gradient sink (nn/grad_sink.h) takes the sums instead of .grad: over micro-batches it holds what
// autograd's gradients add up to and .grad stays undefined; a bf16 parameter (FSDP's views) gets its
// float32 sum there; a sink of the wrong shape is an error naming the parameter's.
TEST(AccumLinear, GradSinkTakesTheSumsInsteadOfGrad) {
  using tessera::nn::setGradSink;
  auto p = makeParams(6, 4, true);
  auto ref = copyOf(p);
  auto sinkW = at::zeros({6, 4}), sinkB = at::zeros({6});
  setGradSink(p.w, [&] { return sinkW; });
  setGradSink(p.b, [&] { return sinkB; });
  for (int m = 0; m < 3; ++m) {
    auto x = at::randn({5, 4}), probe = at::randn({5, 6});
    (linearAccumulateGrad(x, p.w, p.b) * probe).sum().backward();
    (at::linear(x, ref.w, ref.b) * probe).sum().backward();
  }
  expectClose(sinkW, ref.w.grad(), "weight gradient in its sink");
  expectClose(sinkB, ref.b.grad(), "bias gradient in its sink");
  EXPECT_FALSE(p.w.grad().defined() || p.b.grad().defined()) << ".grad written despite the sinks";

  auto w16 = p.w.detach().to(at::kBFloat16).requires_grad_(true);
  auto sink16 = at::zeros({6, 4});
  setGradSink(w16, [&] { return sink16; });
  auto xb = at::randn({5, 4}).to(at::kBFloat16);
  auto probe = at::randn({5, 6}).to(at::kBFloat16);
  (linearAccumulateGrad(xb, w16) * probe).sum().backward();
  EXPECT_FALSE(w16.grad().defined()) << "the bf16 weight got a .grad despite its sink";
  expectClose(sink16, probe.to(at::kFloat).t().mm(xb.to(at::kFloat)), "bf16 weight's float32 gradient in its sink");

  setGradSink(p.b, [] { return at::zeros({5}); });
  try {
    linearAccumulateGrad(at::randn({5, 4}), p.w, p.b).sum().backward();
    ADD_FAILURE() << "a sink of the wrong shape was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter of shape [6]"), std::string::npos) << e.what();
  }
  for (const auto& t : {p.w, p.b, w16}) setGradSink(t, {});
  EXPECT_FALSE(tessera::nn::hasGradSink(w16));
}

TEST(AccumLinear, RefusesWhatItCannotAccumulateInto) {
  auto x = at::randn({4, 2});
  auto expectError = [&](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto w64 = at::randn({3, 2}, at::kDouble).requires_grad_(true);
  expectError([&] { linearAccumulateGrad(x.to(at::kDouble), w64); }, "weight must be a float32 leaf");
  auto leaf = at::randn({3, 2}).requires_grad_(true);
  auto notLeaf = leaf * 2;
  expectError([&] { linearAccumulateGrad(x, notLeaf); }, "not a leaf");
  auto w = at::randn({3, 2}).requires_grad_(true);
  w.mutable_grad() = at::zeros({2, 3}).t();  // right shape, not contiguous
  expectError([&] { linearAccumulateGrad(x, w); }, "not contiguous");
  auto w2 = at::randn({3, 2}).requires_grad_(true);
  expectError([&] { linearAccumulateGrad(at::randn({4, 5}), w2); }, "x [4, 5]");
  auto b = at::randn({4}).requires_grad_(true);
  expectError([&] { linearAccumulateGrad(x, w2, b); }, "bias [4]");
}

TEST(AccumLinear, DeferredWeightGradsWaitForTheQueueAndMatchBitwise) {
  const int64_t out = 6, in = 4;
  auto now = makeParams(out, in, /*bias=*/true), later = copyOf(now);
  tessera::nn::WeightGradQueue queue;
  for (int m = 0; m < 3; ++m) {
    torch::manual_seed(200 + m);
    auto x = at::randn({2, 5, in}), probe = at::randn({2, 5, out});
    auto x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);
    (linearAccumulateGrad(x1, now.w, now.b) * probe).sum().backward();
    const auto wBefore = later.w.grad().defined() ? later.w.grad().clone() : at::Tensor();
    {
      tessera::nn::DeferWeightGrads defer(queue);
      EXPECT_EQ(tessera::nn::deferringWeightGrads(), &queue);
      (linearAccumulateGrad(x2, later.w, later.b) * probe).sum().backward();
    }
    EXPECT_EQ(tessera::nn::deferringWeightGrads(), nullptr);
    EXPECT_TRUE(at::equal(x1.grad(), x2.grad())) << "the input gradient is B's, micro-batch " << m;
    ASSERT_EQ(queue.size(), 2u) << "weight and bias recorded, micro-batch " << m;
    if (m == 0) {
      EXPECT_FALSE(later.w.grad().defined()) << "the weight gradient ran in B";
      EXPECT_FALSE(later.b.grad().defined()) << "the bias gradient ran in B";
    } else {
      EXPECT_TRUE(at::equal(later.w.grad(), wBefore)) << "the weight gradient changed in B, micro-batch " << m;
    }
    queue.run();
    EXPECT_TRUE(queue.empty());
    EXPECT_TRUE(at::equal(later.w.grad(), now.w.grad())) << "weight gradient after W, micro-batch " << m;
    EXPECT_TRUE(at::equal(later.b.grad(), now.b.grad())) << "bias gradient after W, micro-batch " << m;
  }
  tessera::nn::DeferWeightGrads outer(queue);
  try {
    tessera::nn::DeferWeightGrads inner(queue);
    ADD_FAILURE() << "a second scope opened";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already open"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tessera::nn::deferringWeightGrads(), &queue) << "the refused scope closed the open one";
}

TEST(GemmAccumulate, WeightGradTNDtypes) {
  torch::manual_seed(5);
  auto a = at::randn({9, 4}), b = at::randn({9, 6});
  // bf16 inputs, float32 parameter: the float32 sum of the bf16 products, returned as float32.
  auto g = tessera::kernels::weightGradTN(a.to(at::kBFloat16), b.to(at::kBFloat16), at::kFloat);
  ASSERT_EQ(g.scalar_type(), at::kFloat);
  expectClose(g, a.to(at::kBFloat16).to(at::kFloat).t().mm(b.to(at::kBFloat16).to(at::kFloat)), "bf16 -> fp32");
  // Non-contiguous inputs are taken (made contiguous first).
  auto at_ = at::randn({4, 9}).to(at::kBFloat16);
  expectClose(tessera::kernels::weightGradTN(at_.t(), b.to(at::kBFloat16), at::kFloat),
              at_.to(at::kFloat).mm(b.to(at::kBFloat16).to(at::kFloat)), "transposed a");
  // Other combinations: the plain product in the parameter's dtype.
  auto plain = tessera::kernels::weightGradTN(a, b, at::kFloat);
  expectClose(plain, a.t().mm(b), "fp32");
  EXPECT_EQ(tessera::kernels::weightGradTN(a, b, at::kBFloat16).scalar_type(), at::kBFloat16);
  try {
    tessera::kernels::weightGradTN(a.to(at::kBFloat16), at::randn({8, 6}).to(at::kBFloat16), at::kFloat);
    ADD_FAILURE() << "mismatched k accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weightGradTN"), std::string::npos) << e.what();
  }
}

TEST(GemmAccumulate, ReferenceIsAccPlusATransposeB) {
  auto acc = at::randn({5, 3}), a = at::randn({7, 5}), b = at::randn({7, 3});
  auto want = acc + a.t().mm(b);
  tessera::kernels::gemmAccumulateTN(acc, a, b);
  expectClose(acc, want, "acc += aᵀ b");
  auto fresh = at::full({5, 3}, 123.0);
  tessera::kernels::gemmAccumulateTN(fresh, a, b, /*overwrite=*/true);
  expectClose(fresh, a.t().mm(b), "overwrite");
  auto empty = at::randn({5, 3});
  auto before = empty.clone();
  tessera::kernels::gemmAccumulateTN(empty, at::empty({0, 5}), at::empty({0, 3}));
  EXPECT_TRUE(at::equal(empty, before)) << "k = 0 adds nothing";
  try {
    tessera::kernels::gemmAccumulateTN(at::zeros({5, 3}), a, at::randn({6, 3}));
    ADD_FAILURE() << "mismatched k accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("b [6, 3]"), std::string::npos) << e.what();
  }
}
