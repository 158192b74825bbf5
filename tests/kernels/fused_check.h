#pragma once
// Comparisons shared by the fused-kernel tests (CPU: references against ATen's composite ops;
// GPU: CUDA kernels against the references): element-wise bounds that report how much of the
// allowed difference was used, and name the worst element when it is exceeded.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace tessera::testing {

constexpr double kU32 = 1.0 / (1 << 24);  // float32 unit roundoff

// Largest |got − want| / allowed over the elements (0 where equal); a gtest failure naming the
// worst element when it is above 1 (or when shapes differ). Both are read as float64 on the CPU.
inline double expectWithin(const at::Tensor& got, const at::Tensor& want, const at::Tensor& allowed,
                           const std::string& what) {
  if (!got.defined() || !want.defined() || got.sizes() != want.sizes()) {
    ADD_FAILURE() << what << ": shapes differ (got " << (got.defined() ? c10::str(got.sizes()) : "undefined")
                  << ", want " << (want.defined() ? c10::str(want.sizes()) : "undefined") << ")";
    return INFINITY;
  }
  auto g = got.detach().cpu().to(at::kDouble).reshape({-1}), w = want.detach().cpu().to(at::kDouble).reshape({-1});
  auto a = allowed.detach().cpu().to(at::kDouble).expand_as(want).reshape({-1});
  auto d = (g - w).abs();
  auto r = at::where(d == 0, at::zeros_like(d), d / a);
  r = at::where(at::isnan(g).logical_and(at::isnan(w)), at::zeros_like(r), r);  // NaN where the reference has one
  const double worst = d.numel() == 0 ? 0 : r.max().item<double>();
  if (!(worst <= 1)) {
    const int64_t i = at::where(at::isnan(r), at::full_like(r, INFINITY), r).argmax().item<int64_t>();
    ADD_FAILURE() << what << ": element " << i << " = " << g[i].item<double>() << ", want " << w[i].item<double>()
                  << ": off by " << d[i].item<double>() << ", " << worst << " times the allowed "
                  << a[i].item<double>();
  }
  return worst;
}

// |got − want| <= atol + rtol · |want| elementwise (float32 maths in another order).
inline double expectClose(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                          const std::string& what) {
  auto w = want.detach().cpu().to(at::kDouble);
  return expectWithin(got, want, w.abs() * rtol + atol, what);
}

// expectClose at the CPU references' tolerance: relative 1e-5, absolute 1e-6 of want's largest
// magnitude (float32 maths in another order than ATen's composite ops).
inline double expectCloseToAten(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double scale = want.abs().max().item<double>();
  return expectClose(got, want, 1e-5, 1e-6 * scale + 1e-30, what);
}

// One unit in the last place of a bfloat16 (8 significant bits) of magnitude |x| (x float64):
// 2^(floor(log2 |x|) − 7); 2^-133 (the smallest subnormal's spacing) at 0.
inline at::Tensor bf16Ulp(const at::Tensor& x) {
  auto ax = x.abs().clamp_min(std::ldexp(1.0, -126));
  return at::pow(2.0, at::floor(at::log2(ax)) - 7);
}

// Random values whose magnitudes spread over 10^lo..10^hi with random signs.
inline at::Tensor spread(at::IntArrayRef shape, double lo, double hi) {
  auto mag = at::pow(10.0, at::rand(shape, at::kDouble) * (hi - lo) + lo);
  return (mag * at::sign(at::randn(shape, at::kDouble))).to(at::kFloat);
}

}  // namespace tessera::testing
