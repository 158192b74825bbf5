// The fused CUDA kernels (src/kernels: norm, rotary, activations, cross_entropy) against their CPU
// references on one GPU: float32 and bfloat16 (and the autocast pair float32 in, bfloat16 out for
// the norms), odd sizes (scalar paths: widths not multiples of 4, head halves odd) and the
// 4/8-wide paths, the widths of the models' tensor-parallel shards (d 2048 / 4096 / 8192, FFN
// 8192 / 4096, head dim 64 / 128, vocab 32000 / 128256 / 2). Skips visibly without a GPU or a
// CUDA LibTorch.
//
// Tolerances, from the rounding bound (u = 2^-24; each bound is printed as the fraction used):
// - Both sides compute in float32 from the same inputs (bf16 inputs convert exactly). Where a
//   result is a sum of n terms, the two sides sum in other orders (the GPU: per-thread runs and
//   a tree; ATen: cascaded vector sums): each is within n·u·Σ|terms| of the exact sum (Higham's
//   γ_n, worst case), so we allow K·u·Σ|terms| with K = 2·log2(n) + 32 for row statistics (both
//   sides sum in trees of about log2 n levels) and K = n + 32 for sums over rows (the GPU adds
//   per-block partial sums one after the other).
// - Elementwise results (rotary, SwiGLU, GELU, the loss gradient) take a few roundings and
//   library functions (CUDA expf/erff: 2 ulp; ATen's vectorised exp/erf: 1 ulp): 16 to 32 u of
//   the magnitudes of the terms they combine (computed in float64 from the reference's inputs).
// - bfloat16 outputs: both sides round their float32 results once; two float32 values within the
//   bound above round to bf16 values at most one bf16 ulp apart (of the larger), so one bf16 ulp
//   of the reference's value is added.
// A wrong kernel (missed eps, bias, mean, wrong pair or column) is off by orders of magnitude more.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "comm/gpu/gpu_test_util.h"
#include "fused_check.h"
#include "kernels/activations.h"
#include "kernels/cross_entropy.h"
#include "kernels/norm.h"
#include "kernels/rotary.h"
#include "tessera/nn/rope.h"

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

const at::Device kGpu(at::kCUDA, 0);

at::Tensor f64(const at::Tensor& t) { return t.detach().cpu().to(at::kDouble); }

// The float32 bound plus one bf16 ulp of the reference where the result is bfloat16.
at::Tensor allowed(const at::Tensor& want, const at::Tensor& f32Bound) {
  auto a = f32Bound.to(at::kDouble);
  if (want.scalar_type() == at::kBFloat16) a = a * (1 + 1.0 / 128) + bf16Ulp(f64(want));
  return a;
}

double log2d(int64_t n) { return std::ceil(std::log2(static_cast<double>(std::max<int64_t>(n, 2)))); }

struct NormCase {
  at::ScalarType x, y;
};

TEST(FusedKernelsGpu, NormsMatchReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(31);
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {7, 33}, {64, 2048}, {257, 4096}, {3, 5, 8192}, {5, 2050}};
  const NormCase cases[] = {{at::kFloat, at::kFloat}, {at::kBFloat16, at::kBFloat16}, {at::kFloat, at::kBFloat16}};
  double worst = 0;
  for (auto kind : {NormKind::Rms, NormKind::Layer}) {
    for (const auto& shape : shapes) {
      for (const auto& c : cases) {
        const int64_t d = shape.back(), rows = at::ones(shape).numel() / d;
        const auto where = fmt::format("{} {} {}->{}", kind == NormKind::Rms ? "rms" : "layer", c10::str(shape),
                                       c10::toString(c.x), c10::toString(c.y));
        auto x = (at::randn(shape) * 3 + 0.5).to(c.x), w = at::randn({d}) + 1, b = at::randn({d});
        auto bias = kind == NormKind::Layer ? b : at::Tensor();
        auto want = normForwardReference(kind, x, w, bias, 1e-5, c.y);
        auto got = normForward(kind, x.to(kGpu), w.to(kGpu), bias.defined() ? bias.to(kGpu) : bias, 1e-5, c.y);
        const double K = 2 * log2d(d) + 32;
        auto x64 = f64(x).reshape({rows, d});
        auto mean = kind == NormKind::Layer ? f64(want.mean).unsqueeze(1) : at::zeros({rows, 1}, at::kDouble);
        auto r = f64(want.rstd).unsqueeze(1);
        auto xhat = (x64 - mean) * r;
        // y = (x − mean)·rstd·w + b: besides its own roundings, y carries the statistics' errors — the
        // mean's (bounded by K·u·mean|x| below) times rstd·|w|, and rstd's relative one times |x̂·w|.
        auto yTerms = (xhat * f64(w)).abs() + (bias.defined() ? f64(bias).abs() : at::zeros({d}, at::kDouble));
        if (kind == NormKind::Layer) yTerms = yTerms + r * x64.abs().mean(1, true) * f64(w).abs();
        worst = std::max(worst, expectWithin(got.y, want.y, allowed(want.y, yTerms.view(want.y.sizes()) * (K * kU32)),
                                             where + " y"));
        worst = std::max(worst, expectWithin(got.rstd, want.rstd, f64(want.rstd) * (K * kU32), where + " rstd"));
        if (kind == NormKind::Layer) {
          worst = std::max(worst, expectWithin(got.mean, want.mean, x64.abs().mean(1) * (K * kU32), where + " mean"));
        }
        // Backward from the reference's statistics on both sides.
        auto gy = at::randn(shape).to(c.y);
        auto gw = normBackwardReference(kind, gy, x, w, want.mean, want.rstd, bias.defined());
        auto gg = normBackward(kind, gy.to(kGpu), x.to(kGpu), w.to(kGpu), want.mean.defined() ? want.mean.to(kGpu) : want.mean,
                               want.rstd.to(kGpu), bias.defined());
        auto g64 = f64(gy).reshape({rows, d});
        auto gp = (g64 * f64(w)).abs();
        auto gxTerms = r * (gp + gp.mean(1, true) + xhat.abs() * (gp * xhat.abs()).mean(1, true));
        worst = std::max(worst, expectWithin(gg.gx, gw.gx, allowed(gw.gx, gxTerms.view(gw.gx.sizes()) * (K * kU32)),
                                             where + " gx"));
        const double R = static_cast<double>(rows) + 32;
        worst = std::max(worst, expectWithin(gg.gw, gw.gw, (g64 * xhat).abs().sum(0) * (R * kU32), where + " gw"));
        if (bias.defined()) {
          worst = std::max(worst, expectWithin(gg.gb, gw.gb, g64.abs().sum(0) * (R * kU32), where + " gb"));
        }
      }
    }
  }
  fmt::print("norms: largest difference from the reference, as a fraction of its bound: {:.3g}\n", worst);
}

TEST(FusedKernelsGpu, RotaryMatchesReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(32);
  struct Case {
    int64_t T, B, qH, kvH, hd;
  };
  double worst = 0;
  for (const auto& c : {Case{5, 3, 4, 2, 6}, Case{64, 2, 8, 2, 64}, Case{33, 1, 3, 1, 128}, Case{16, 4, 2, 2, 2}}) {
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const auto where = fmt::format("T {} B {} heads {}+2x{} hd {} {}", c.T, c.B, c.qH, c.kvH, c.hd, c10::toString(dt));
      const auto t = nn::ropeTables(c.T, c.hd, 500000, {true, 32, 1, 4, 8}, at::kCPU);
      const int64_t heads = c.qH + c.kvH, W = (c.qH + 2 * c.kvH) * c.hd;
      auto h = at::randn({c.T, c.B, W}).to(dt);
      auto want = h.clone();
      ropeInPlaceReference(want, heads, c.hd, t.cos, t.sin);
      auto got = h.to(kGpu);
      ropeInPlace(got, heads, c.hd, t.cos.to(kGpu), t.sin.to(kGpu));
      // Bound: 4 u of |a·c| + |b·s| per output (the pair's partner: the other half of the head).
      auto pairTerms = [&](const at::Tensor& x) {
        auto v = f64(x).narrow(2, 0, heads * c.hd).view({c.T, c.B, heads, 2, c.hd / 2});
        auto cs = f64(t.cos).narrow(0, 0, c.T).narrow(1, 0, c.hd / 2).view({c.T, 1, 1, 1, c.hd / 2}).abs();
        auto sn = f64(t.sin).narrow(0, 0, c.T).narrow(1, 0, c.hd / 2).view({c.T, 1, 1, 1, c.hd / 2}).abs();
        auto terms = v.abs() * cs + v.flip(3).abs() * sn;  // |x·c| + |partner·s|
        auto full = at::zeros({c.T, c.B, W}, at::kDouble);
        full.narrow(2, 0, heads * c.hd).copy_(terms.reshape({c.T, c.B, heads * c.hd}));
        return full;
      };
      worst = std::max(worst, expectWithin(got, want, allowed(want, pairTerms(h) * (4 * kU32)), where + " forward"));
      auto gy = at::randn({c.T, c.B, W}).to(dt);
      auto gw = ropeBackwardReference(gy, heads, c.hd, t.cos, t.sin);
      auto gg = ropeBackward(gy.to(kGpu), heads, c.hd, t.cos.to(kGpu), t.sin.to(kGpu));
      worst = std::max(worst, expectWithin(gg, gw, allowed(gw, pairTerms(gy) * (4 * kU32)), where + " backward"));
      EXPECT_TRUE(at::equal(gg.cpu().narrow(2, heads * c.hd, c.kvH * c.hd), gy.narrow(2, heads * c.hd, c.kvH * c.hd)))
          << where << ": v's gradient must be copied unchanged";
    }
  }
  fmt::print("rotary: largest difference from the reference, as a fraction of its bound: {:.3g}\n", worst);
}

TEST(FusedKernelsGpu, SwigluAndBiasGeluMatchReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(33);
  double worst = 0;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 13}, {33, 1024}, {4, 3, 4096}, {2, 2, 8192}}) {
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const int64_t f = shape.back();
      const auto where = fmt::format("{} {}", c10::str(shape), c10::toString(dt));
      auto twice = shape;
      twice.back() *= 2;
      // SwiGLU: y = silu(g)·u; gg = gy·u·σ(1 + g(1−σ)), gu = gy·g·σ.
      auto h = (at::randn(twice) * 3).to(dt);
      auto y = swigluForwardReference(h);
      auto h64 = f64(h);
      auto g = h64.narrow(-1, 0, f), u = h64.narrow(-1, f, f), s = at::sigmoid(g);
      worst = std::max(worst, expectWithin(swigluForward(h.to(kGpu)), y, allowed(y, (g * s * u).abs() * (16 * kU32)),
                                           where + " swiglu"));
      auto gy = at::randn(shape).to(dt);
      auto go = f64(gy);
      auto gh = swigluBackwardReference(gy, h);
      auto ggTerms = (go * u).abs() * s * (1 + g.abs() * (1 - s));
      auto guTerms = (go * g * s).abs();
      worst = std::max(worst, expectWithin(swigluBackward(gy.to(kGpu), h.to(kGpu)), gh,
                                           allowed(gh, at::cat({ggTerms, guTerms}, -1) * (32 * kU32)),
                                           where + " swiglu backward"));
      // bias + GELU: y = z·Φ(z), z = h + b; gz = gy·(Φ(z) + z·φ(z)).
      auto x = (at::randn(shape) * 2).to(dt);
      auto b = at::randn({f});
      auto z = f64(x) + f64(b);
      auto phi = at::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
      auto yg = biasGeluForwardReference(x, b);
      auto yTerms = z.abs() * 0.5 * ((1 + at::erf(z / std::sqrt(2.0))).abs() + 1);
      worst = std::max(worst, expectWithin(biasGeluForward(x.to(kGpu), b.to(kGpu)), yg, allowed(yg, yTerms * (16 * kU32)),
                                           where + " bias+gelu"));
      auto gr = biasGeluBackwardReference(gy, x, b);
      auto gc = biasGeluBackward(gy.to(kGpu), x.to(kGpu), b.to(kGpu));
      auto gzTerms = go.abs() * (1 + z.abs() * phi * (2 + z * z));
      worst = std::max(worst, expectWithin(gc.gh, gr.gh, allowed(gr.gh, gzTerms * (32 * kU32)), where + " bias+gelu gh"));
      const double R = static_cast<double>(gy.numel() / f) + 32;
      auto gb64 = f64(gr.gh).abs().reshape({-1, f}).sum(0);
      worst = std::max(worst, expectWithin(gc.gb, gr.gb, gb64 * (R * kU32) + gzTerms.reshape({-1, f}).sum(0) * (32 * kU32),
                                           where + " bias+gelu gb"));
    }
  }
  fmt::print("activations: largest difference from the reference, as a fraction of its bound: {:.3g}\n", worst);
}

TEST(FusedKernelsGpu, CrossEntropyPiecesMatchReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(34);
  struct Case {
    int64_t n, w, start;
  };
  double worst = 0;
  for (const auto& c : {Case{37, 53, 0}, Case{64, 32000, 32000}, Case{16, 64128, 64128}, Case{9, 2, 1}}) {
    for (auto dt : {at::kFloat, at::kBFloat16}) {
      const auto where = fmt::format("N {} W {} start {} {}", c.n, c.w, c.start, c10::toString(dt));
      auto logits = (at::randn({c.n, c.w}) * 4).to(dt);
      auto targets = at::randint(0, 2 * c.w + c.start + 3, {c.n}, at::kLong);  // some on other shards
      auto want = crossEntropyPartialsReference(logits, targets, c.start);
      auto got = crossEntropyPartials(logits.to(kGpu), targets.to(kGpu), c.start).cpu();
      EXPECT_TRUE(at::equal(got[0], want[0])) << where << ": the row max must be exact";
      EXPECT_TRUE(at::equal(got[2], want[2])) << where << ": the target logit must be exact";
      const double K = 2.0 * (static_cast<double>(c.w) + 32);
      worst = std::max(worst, expectWithin(got[1], want[1], f64(want[1]) * (K * kU32), where + " sum of exp"));
      // The gradient from the same row statistics on both sides.
      auto m = want[0].contiguous(), s = want[1].contiguous();
      auto gOverN = at::scalar_tensor(0.37 / static_cast<double>(c.n), at::kFloat);
      auto gr = crossEntropyGradReference(logits, targets, c.start, m, s, gOverN);
      auto gc = crossEntropyGrad(logits.to(kGpu), targets.to(kGpu), c.start, m.to(kGpu), s.to(kGpu), gOverN.to(kGpu));
      auto p = (f64(logits) - f64(m).unsqueeze(1)).exp() * (0.37 / static_cast<double>(c.n)) / f64(s).unsqueeze(1);
      auto local = targets - c.start;
      auto inside = (local >= 0).logical_and(local < c.w).to(at::kDouble).unsqueeze(1);
      auto terms = p + at::zeros_like(p).scatter_(1, local.clamp(0, c.w - 1).unsqueeze(1),
                                                   inside * (0.37 / static_cast<double>(c.n)));
      worst = std::max(worst, expectWithin(gc, gr, allowed(gr, terms * (16 * kU32)), where + " gradient"));
      // Written over the logits: the same kernel, so the same bits as the separate gradient.
      auto onGpu = logits.to(kGpu);
      auto gi = crossEntropyGradInPlace(onGpu, targets.to(kGpu), c.start, m.to(kGpu), s.to(kGpu), gOverN.to(kGpu));
      EXPECT_EQ(gi.data_ptr(), onGpu.data_ptr()) << where;
      EXPECT_TRUE(at::equal(gi.cpu(), gc.cpu())) << where << ": the in-place gradient differs";
      // The first W columns of a buffer padded to a multiple of 64 (odd vocabularies): the same bits.
      const int64_t wp = (c.w + 63) / 64 * 64 + (c.w % 64 == 0 ? 64 : 0);
      auto buffer = at::zeros({c.n, wp}, logits.options().device(kGpu));
      auto padded = buffer.narrow(1, 0, c.w);
      padded.copy_(logits.to(kGpu));
      auto pp = crossEntropyPartials(padded, targets.to(kGpu), c.start).cpu();
      EXPECT_TRUE(at::equal(pp, got)) << where << ": padded rows' pieces differ";
      auto gp = crossEntropyGradInPlace(padded, targets.to(kGpu), c.start, m.to(kGpu), s.to(kGpu), gOverN.to(kGpu));
      EXPECT_TRUE(at::equal(gp.cpu(), gc.cpu())) << where << ": padded rows' gradient differs";
      EXPECT_EQ(buffer.narrow(1, c.w, wp - c.w).count_nonzero().item<int64_t>(), 0) << where << ": padding written";
    }
  }
  fmt::print("cross-entropy: largest difference from the reference, as a fraction of its bound: {:.3g}\n", worst);
}

}  // namespace
