// The residual add + norm kernels (kernels/add_norm.h) against their references on one GPU:
// RMSNorm and LayerNorm; a float32 stream with a float32 branch, a bfloat16 stream and branch,
// a float32 stream with a bfloat16 branch and bfloat16 output (autocast, the models' case), no
// branch, and a bfloat16 stream with a float32 branch (the ATen add before the kernel); odd
// widths (scalar paths), the 4-wide paths, the models' widths, and enough rows that the weight
// gradients take every row group of the backward (the second-stage column sums). Skips visibly
// without a GPU or a CUDA LibTorch.
//
// Tolerances (u = 2^-24), as test_fused_ops_gpu.cpp's norms:
// - s = x + branch: one IEEE addition and one rounding to s's dtype on both sides: bitwise.
// - y, mean, rstd: the norm of the same s: the norm test's bounds (K·u·Σ|terms|, K = 2·log2 d
//   + 32, plus one bf16 ulp of the reference for bf16 outputs).
// - gx (= gbranch): the norm's bound for its gradient, plus 2·u·(|norm gx| + |gs|) for the add;
//   with a bf16 stream the reference rounds the norm's gradient to bf16 before adding gs and
//   rounds again (the kernel rounds once): one bf16 ulp of the reference's norm gradient and
//   one of the result. A bf16 branch's gradient of a float32 stream: the float32 bound plus one
//   bf16 ulp (both round their float32 sum once).
// - gw, gb: sums over the rows: (rows + 32)·u·Σ|terms|; and bitwise equal on a second run (the
//   column sums run in a fixed order).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "comm/gpu/gpu_test_util.h"
#include "fused_check.h"
#include "kernels/add_norm.h"

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

const at::Device kGpu(at::kCUDA, 0);

at::Tensor f64(const at::Tensor& t) { return t.detach().cpu().to(at::kDouble); }
at::Tensor gpu(const at::Tensor& t) { return t.defined() ? t.to(kGpu) : t; }

at::Tensor allowed(const at::Tensor& want, const at::Tensor& f32Bound) {
  auto a = f32Bound.to(at::kDouble);
  if (want.scalar_type() == at::kBFloat16) a = a * (1 + 1.0 / 128) + bf16Ulp(f64(want));
  return a;
}

double log2d(int64_t n) { return std::ceil(std::log2(static_cast<double>(std::max<int64_t>(n, 2)))); }

struct Case {
  at::ScalarType x, branch, y;
  bool withBranch;
};

TEST(FusedAddNormGpu, MatchesReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(41);
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {7, 33}, {64, 2048}, {3, 5, 8192}, {5, 2050}, {2000, 1536}};
  const Case cases[] = {{at::kFloat, at::kFloat, at::kFloat, true},
                        {at::kBFloat16, at::kBFloat16, at::kBFloat16, true},
                        {at::kFloat, at::kBFloat16, at::kBFloat16, true},
                        {at::kFloat, at::kFloat, at::kBFloat16, false},
                        {at::kBFloat16, at::kFloat, at::kBFloat16, true}};
  double worst = 0;
  for (auto kind : {NormKind::Rms, NormKind::Layer}) {
    for (const auto& shape : shapes) {
      for (const auto& c : cases) {
        const int64_t d = shape.back(), rows = at::ones(shape).numel() / d;
        const auto where = fmt::format("{} {} {}+{}->{}", kind == NormKind::Rms ? "rms" : "layer", c10::str(shape),
                                       c10::toString(c.x), c.withBranch ? c10::toString(c.branch) : "none",
                                       c10::toString(c.y));
        auto x = (at::randn(shape) * 3 + 0.5).to(c.x), w = at::randn({d}) + 1;
        auto branch = c.withBranch ? at::randn(shape).to(c.branch) : at::Tensor();
        auto bias = kind == NormKind::Layer ? at::randn({d}) : at::Tensor();
        auto want = addNormForwardReference(kind, x, branch, w, bias, 1e-5, c.y);
        const auto xg = gpu(x);
        auto got = addNormForward(kind, xg, gpu(branch), gpu(w), gpu(bias), 1e-5, c.y);
        ASSERT_EQ(got.s.scalar_type(), want.s.scalar_type()) << where;
        EXPECT_TRUE(at::equal(got.s.cpu(), want.s)) << where << ": s must be bitwise the reference's add";
        if (!c.withBranch) EXPECT_EQ(got.s.data_ptr(), xg.data_ptr()) << where << ": without a branch s is x";
        const double K = 2 * log2d(d) + 32;
        auto s64 = f64(want.s).reshape({rows, d});
        auto mean = kind == NormKind::Layer ? f64(want.mean).unsqueeze(1) : at::zeros({rows, 1}, at::kDouble);
        auto r = f64(want.rstd).unsqueeze(1);
        auto xhat = (s64 - mean) * r;
        auto yTerms = (xhat * f64(w)).abs() + (bias.defined() ? f64(bias).abs() : at::zeros({d}, at::kDouble));
        if (kind == NormKind::Layer) yTerms = yTerms + r * s64.abs().mean(1, true) * f64(w).abs();
        worst = std::max(worst, expectWithin(got.y, want.y, allowed(want.y, yTerms.view(want.y.sizes()) * (K * kU32)),
                                             where + " y"));
        worst = std::max(worst, expectWithin(got.rstd, want.rstd, f64(want.rstd) * (K * kU32), where + " rstd"));
        if (kind == NormKind::Layer) {
          worst = std::max(worst, expectWithin(got.mean, want.mean, s64.abs().mean(1) * (K * kU32), where + " mean"));
        }
        // Backward from the reference's s and statistics on both sides.
        const auto sType = want.s.scalar_type();
        auto gy = at::randn(shape).to(c.y), gs = at::randn(shape).to(sType);
        const c10::optional<c10::ScalarType> bType = c.withBranch ? c10::optional<c10::ScalarType>(c.branch) : c10::nullopt;
        auto gw = addNormBackwardReference(kind, gy, gs, want.s, w, want.mean, want.rstd, bias.defined(), bType);
        auto backward = [&] {
          return addNormBackward(kind, gpu(gy), gpu(gs), gpu(want.s), gpu(w), gpu(want.mean), gpu(want.rstd),
                                 bias.defined(), bType);
        };
        auto gg = backward();
        auto normOnly = normBackwardReference(kind, gy, want.s, w, want.mean, want.rstd, false).gx;
        auto g64 = f64(gy).reshape({rows, d});
        auto gp = (g64 * f64(w)).abs();
        auto gxTerms = r * (gp + gp.mean(1, true) + xhat.abs() * (gp * xhat.abs()).mean(1, true));
        auto gxBound = gxTerms.view(shape) * (K * kU32) + (f64(normOnly).abs() + f64(gs).abs()) * (2 * kU32);
        if (sType == at::kBFloat16) gxBound = gxBound + bf16Ulp(f64(normOnly));
        worst = std::max(worst, expectWithin(gg.gx, gw.gx, allowed(gw.gx, gxBound), where + " gx"));
        if (c.withBranch) {
          ASSERT_TRUE(gg.gbranch.defined()) << where;
          EXPECT_EQ(gg.gbranch.scalar_type(), c.branch) << where;
          if (c.branch == sType) {
            EXPECT_EQ(gg.gbranch.data_ptr(), gg.gx.data_ptr()) << where << ": gbranch must be gx itself";
          } else {
            worst = std::max(worst, expectWithin(gg.gbranch, gw.gbranch, allowed(gw.gbranch, gxBound),
                                                 where + " gbranch"));
          }
        } else {
          EXPECT_FALSE(gg.gbranch.defined()) << where;
        }
        const double R = static_cast<double>(rows) + 32;
        worst = std::max(worst, expectWithin(gg.gw, gw.gw, (g64 * xhat).abs().sum(0) * (R * kU32), where + " gw"));
        if (bias.defined()) {
          worst = std::max(worst, expectWithin(gg.gb, gw.gb, g64.abs().sum(0) * (R * kU32), where + " gb"));
        }
        auto again = backward();
        EXPECT_TRUE(at::equal(again.gw, gg.gw)) << where << ": gw differs between two runs";
        if (bias.defined()) EXPECT_TRUE(at::equal(again.gb, gg.gb)) << where << ": gb differs between two runs";
      }
    }
  }
  fmt::print("add + norm: largest difference from the reference, as a fraction of its bound: {:.3g}\n", worst);
}

// Misaligned views (an offset of one element) take the scalar paths of the same kernels.
TEST(FusedAddNormGpu, UnalignedTensorsTakeTheScalarPath) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(42);
  const int64_t rows = 9, d = 64;
  auto xs = at::randn({rows * d + 1}).to(kGpu), bs = at::randn({rows * d + 1}).to(kGpu);
  auto x = xs.narrow(0, 1, rows * d).view({rows, d}), b = bs.narrow(0, 1, rows * d).view({rows, d});
  auto w = at::randn({d}).to(kGpu) + 1;
  auto got = addNormForward(NormKind::Rms, x, b, w, {}, 1e-6, at::kFloat);
  auto want = addNormForwardReference(NormKind::Rms, x.cpu(), b.cpu(), w.cpu(), {}, 1e-6, at::kFloat);
  EXPECT_TRUE(at::equal(got.s.cpu(), want.s));
  expectClose(got.y, want.y, 1e-5, 1e-6, "unaligned rms y");
}

}  // namespace
