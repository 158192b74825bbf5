// The fused ops' CPU paths (nn/fused_norm.h, nn/fused_activations.h, nn::ropeQkInPlace: the
// references of kernels/norm.h, activations.h, rotary.h behind autograd ops) against ATen's
// composite ops with autograd: values, input gradients and parameter gradients, float32, odd
// sizes (rows and widths that are not multiples of 4 or of a warp), 2-D and 3-D inputs, and the
// tensor-parallel shapes the models give them (a sequence-parallel token shard [T/tp, B, d], an
// FFN shard F/tp, a tp rank's q/k/v heads with grouped-query attention).
// Tolerance: both sides compute the same float32 maths with their ops in another order (sums
// of d or of the rows, exp/erf from one library): |Δ| <= 1e-5·|want| + 1e-6·max|want|. A wrong
// formula (a missing eps, mean, bias or factor) is off by far more. The rotary embedding's
// forward is applyRope's ops in applyRope's order: bitwise.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "fused_check.h"
#include "harness/multiprocess.h"
#include "tessera/nn/fused_activations.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/nn/rope.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

void close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  expectCloseToAten(got, want, what);
}

// y = f(leaves) on copies of `inputs` both ways; compares y and every input's gradient for one
// random upstream gradient.
template <typename Fused, typename Composite>
void compareOp(const std::vector<at::Tensor>& inputs, Fused fused, Composite composite, const std::string& what) {
  std::vector<at::Tensor> a, b;
  for (const auto& t : inputs) {
    a.push_back(t.detach().clone().requires_grad_());
    b.push_back(t.detach().clone().requires_grad_());
  }
  auto ya = fused(a), yb = composite(b);
  ASSERT_EQ(ya.sizes(), yb.sizes()) << what;
  EXPECT_EQ(ya.scalar_type(), yb.scalar_type()) << what;
  close(ya, yb, what + ": output");
  auto gy = at::randn(yb.sizes());
  ya.backward(gy);
  yb.backward(gy);
  for (size_t i = 0; i < inputs.size(); ++i) close(a[i].grad(), b[i].grad(), fmt::format("{}: gradient of input {}", what, i));
}

// Odd widths (3, 33) take the scalar paths. Width 1 is checked on its own below: there the
// composite's result is rounding noise amplified by rstd (x − mean is 0 in exact arithmetic), so
// no relative comparison with it means anything.
const std::vector<std::vector<int64_t>> kNormShapes = {{7, 33}, {3, 5, 64}, {2, 3, 3}, {4, 2, 48}, {1, 1, 2050}};

TEST(FusedNorm, RmsNormMatchesComposite) {
  at::manual_seed(1);
  for (const auto& shape : kNormShapes) {
    const int64_t d = shape.back();
    const double eps = 1e-5;
    compareOp({at::randn(shape) * 3, at::randn({d}) + 1},
              [&](const std::vector<at::Tensor>& t) { return nn::rmsNorm(t[0], t[1], eps); },
              [&](const std::vector<at::Tensor>& t) {
                return t[0] * at::rsqrt(t[0].pow(2).mean(-1, true) + eps) * t[1];
              },
              fmt::format("rmsNorm {}", c10::str(shape)));
  }
}

TEST(FusedNorm, LayerNormMatchesComposite) {
  at::manual_seed(2);
  for (const auto& shape : kNormShapes) {
    const int64_t d = shape.back();
    compareOp({at::randn(shape) * 2 + 0.5, at::randn({d}) + 1, at::randn({d})},
              [&](const std::vector<at::Tensor>& t) { return nn::layerNorm(t[0], t[1], t[2], 1e-5); },
              [&](const std::vector<at::Tensor>& t) { return at::layer_norm(t[0], {d}, t[1], t[2], 1e-5); },
              fmt::format("layerNorm {}", c10::str(shape)));
    compareOp({at::randn(shape), at::randn({d}) + 1},
              [&](const std::vector<at::Tensor>& t) { return nn::layerNorm(t[0], t[1], {}, 1e-3); },
              [&](const std::vector<at::Tensor>& t) { return at::layer_norm(t[0], {d}, t[1], {}, 1e-3); },
              fmt::format("layerNorm without bias {}", c10::str(shape)));
  }
}

// LayerNorm over one element is its bias, exactly, and passes no gradient to its input: the
// fused op computes x − mean as an exact 0 (ATen's composite leaves rounding noise times rstd).
TEST(FusedNorm, LayerNormOfWidthOneIsItsBias) {
  at::manual_seed(3);
  auto x = (at::randn({2, 3, 1}) * 2 + 0.5).requires_grad_(), w = (at::randn({1}) + 1).requires_grad_();
  auto b = at::randn({1}).requires_grad_();
  auto y = nn::layerNorm(x, w, b, 1e-5);
  EXPECT_TRUE(at::equal(y, b.detach().expand_as(y))) << y;
  y.backward(at::randn(y.sizes()));
  EXPECT_TRUE(at::equal(x.grad(), at::zeros_like(x))) << x.grad();
  EXPECT_TRUE(at::equal(w.grad(), at::zeros_like(w))) << w.grad();
}

TEST(FusedNorm, NonContiguousInputAndErrors) {
  at::manual_seed(3);
  auto x = at::randn({6, 10}).t();  // [10, 6], not contiguous: the op makes it so
  compareOp({x, at::randn({6})}, [](const std::vector<at::Tensor>& t) { return nn::rmsNorm(t[0], t[1], 1e-6); },
            [](const std::vector<at::Tensor>& t) { return t[0] * at::rsqrt(t[0].pow(2).mean(-1, true) + 1e-6) * t[1]; },
            "rmsNorm of a transposed input");
  EXPECT_NO_THROW(expectErrorContaining([] { nn::rmsNorm(at::randn({4, 8}), at::ones({7}), 1e-5); },
                        {"rmsNormForward", "weight", "[7]"}));
  EXPECT_NO_THROW(expectErrorContaining([] { nn::layerNorm(at::randn({4, 8}).to(at::kDouble), at::ones({8}), {}, 1e-5); },
                        {"layerNormForward", "x", "float64"}));
}

// h [T, B, (qH + 2 kvH) · hd]: q and k heads rotated by the fused op vs applyRope on each.
void compareRope(int64_t T, int64_t B, int64_t qH, int64_t kvH, int64_t hd, const nn::RopeScaling& sc,
                 const std::string& what) {
  const auto tables = nn::ropeTables(T, hd, 500000, sc, at::kCPU);
  const int64_t W = (qH + 2 * kvH) * hd;
  auto h0 = at::randn({T, B, W});
  auto a = h0.clone().requires_grad_(), b = h0.clone().requires_grad_();
  auto ya = nn::ropeQkInPlace(a * 1.0, qH + kvH, tables);  // a fresh tensor, as the projection's output
  auto q = nn::applyRope(b.narrow(2, 0, qH * hd).view({T, B, qH, hd}), tables);
  auto k = nn::applyRope(b.narrow(2, qH * hd, kvH * hd).view({T, B, kvH, hd}), tables);
  auto yb = at::cat({q.reshape({T, B, -1}), k.reshape({T, B, -1}), b.narrow(2, (qH + kvH) * hd, kvH * hd)}, 2);
  EXPECT_TRUE(at::equal(ya, yb)) << what << ": forward not bitwise applyRope's, max |diff| "
                                 << (ya - yb).abs().max().item<double>();
  auto gy = at::randn(yb.sizes());
  ya.backward(gy);
  yb.backward(gy);
  close(a.grad(), b.grad(), what + ": gradient");
  EXPECT_TRUE(at::equal(a.grad().narrow(2, (qH + kvH) * hd, kvH * hd), gy.narrow(2, (qH + kvH) * hd, kvH * hd)))
      << what << ": v's gradient must pass through unchanged";
}

TEST(FusedRope, InPlaceOnQkMatchesApplyRope) {
  at::manual_seed(4);
  compareRope(5, 3, 4, 2, 6, {}, "T 5, B 3, GQA 4/2 heads of 6");            // hd/2 odd
  compareRope(16, 2, 2, 2, 8, {true, 4, 1, 4, 16}, "llama3 scaling, tp shard");  // every scaling regime
  compareRope(7, 1, 1, 1, 2, {}, "one q and one kv head of 2");
}

TEST(FusedRope, BadShapesAreErrors) {
  const auto t = nn::ropeTables(4, 8, 10000, {}, at::kCPU);
  EXPECT_NO_THROW(expectErrorContaining([&] { nn::ropeQkInPlace(at::randn({4, 2, 12}), 2, t); }, {"ropeInPlace", "2 heads", "12"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { nn::ropeQkInPlace(at::randn({5, 2, 16}), 2, t); }, {"ropeInPlace", "cos", "[4, 8]"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { nn::ropeQkInPlace(at::randn({4, 16}), 1, t); }, {"ropeInPlace", "[T, B, W]"}));
}

TEST(FusedActivations, SwigluMatchesComposite) {
  at::manual_seed(5);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 14}, {3, 2, 24}, {5, 1, 2}, {2, 4, 96}}) {
    compareOp({at::randn(shape) * 3},
              [](const std::vector<at::Tensor>& t) { return nn::swiglu(t[0]); },
              [](const std::vector<at::Tensor>& t) {
                const int64_t f = t[0].size(-1) / 2;
                return at::silu(t[0].narrow(-1, 0, f)) * t[0].narrow(-1, f, f);
              },
              fmt::format("swiglu {}", c10::str(shape)));
  }
  EXPECT_NO_THROW(expectErrorContaining([] { nn::swiglu(at::randn({3, 5})); }, {"swigluForward", "[..., 2F]", "[3, 5]"}));
}

// w2 after the SwiGLU with the product recomputed in backward (selective recompute): at::linear
// over the composite's values and gradients; with accumulateGrad the weight gradient lands in
// .grad (summed onto what was there) instead of being returned.
TEST(FusedActivations, SwigluLinearMatchesComposite) {
  at::manual_seed(7);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 14}, {3, 2, 24}, {5, 1, 2}}) {
    const int64_t f = shape.back() / 2;
    compareOp({at::randn(shape) * 3, at::randn({5, f})},
              [](const std::vector<at::Tensor>& t) { return nn::swigluLinear(t[0], t[1], false); },
              [](const std::vector<at::Tensor>& t) {
                const int64_t f = t[0].size(-1) / 2;
                return at::linear(at::silu(t[0].narrow(-1, 0, f)) * t[0].narrow(-1, f, f), t[1]);
              },
              fmt::format("swigluLinear {}", c10::str(shape)));
  }
  auto h = at::randn({4, 3, 16}).requires_grad_(), w = at::randn({6, 8}).requires_grad_();
  auto gy = at::randn({4, 3, 6});
  auto h2 = h.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  at::linear(nn::swiglu(h2), w2).backward(gy);
  w.mutable_grad() = at::ones_like(w);  // accumulated onto
  nn::swigluLinear(h, w, /*accumulateGrad=*/true).backward(gy);
  close(h.grad(), h2.grad(), "swigluLinear accumulating: input gradient");
  close(w.grad() - 1, w2.grad(), "swigluLinear accumulating: weight gradient summed into .grad");
  EXPECT_NO_THROW(expectErrorContaining([] { nn::swigluLinear(at::randn({3, 10}), at::randn({4, 4}), false); },
                                        {"swigluLinear", "[..., 2F]", "[3, 10]", "[4, 4]"}));
}

TEST(FusedActivations, BiasGeluMatchesComposite) {
  at::manual_seed(6);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 13}, {3, 2, 32}, {1, 5, 1}, {4, 2, 64}}) {
    const int64_t f = shape.back();
    compareOp({at::randn(shape) * 2, at::randn({f})},
              [](const std::vector<at::Tensor>& t) { return nn::biasGelu(t[0], t[1]); },
              [](const std::vector<at::Tensor>& t) { return at::gelu(t[0] + t[1]); },
              fmt::format("biasGelu {}", c10::str(shape)));
  }
  EXPECT_NO_THROW(expectErrorContaining([] { nn::biasGelu(at::randn({3, 5}), at::randn({4})); }, {"biasGeluForward", "bias", "[4]"}));
}

}  // namespace
