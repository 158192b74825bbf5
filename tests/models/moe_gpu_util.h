#pragma once
// Shared by test_moe_gpu.cpp and test_moe_fp8_gpu.cpp (one executable): random experts' inputs on
// cuda:0, runExperts forward (under bf16 autocast or not) and backward with its gradients, the
// tolerance check, whether grouped GEMMs run here (REQUIRE_GROUPED skips visibly when not), and a
// timed loop. Tolerance: both ways multiply bf16 operands with float32 accumulation and round h1, h3,
// h and y to bf16; they differ in summation order (tiles), so an element may land on the neighbouring
// bf16 value at each rounding (2^-8 relative). expectClose allows ‖a − b‖ ≤ 2^-6 ‖b‖ (Frobenius) and
// max |a − b| ≤ 2^-4 max |b|: a wrong group (rows through another expert, a missed row) is off by
// the size of the values themselves.
#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/gpu/gpu_test_util.h"
#include "models/moe/grouped.h"
#include "tessera/common/autocast.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"

namespace tessera::moe_gpu_test {

using models::moe_detail::ExpertGemm;

struct Grads {
  at::Tensor y, x, w1, w3, w2;
};

struct Inputs {
  at::Tensor x, counts, w1, w3, w2, g;
};

inline Inputs inputs(std::vector<int64_t> counts, int64_t d, int64_t f, at::ScalarType wdt) {
  at::manual_seed(7);
  const auto dev = at::Device(at::kCUDA, 0);
  const int64_t el = static_cast<int64_t>(counts.size());
  int64_t m = 0;
  for (auto c : counts) m += c;
  auto opt = at::TensorOptions().device(dev);
  return {at::randn({m, d}, opt),
          at::tensor(counts, at::kLong).to(dev),
          (at::randn({el, f, d}, opt) * 0.05).to(wdt),
          (at::randn({el, f, d}, opt) * 0.05).to(wdt),
          (at::randn({el, d, f}, opt) * 0.05).to(wdt),
          at::randn({m, d}, opt)};
}

// Forward under bf16 autocast (when `autocast`), backward of Σ y·g; gradients in float32.
inline Grads run(const Inputs& in, ExpertGemm how, bool autocast, bool checkSync = false, bool fp8 = false) {
  auto x = in.x.clone().requires_grad_(), w1 = in.w1.clone().requires_grad_(), w3 = in.w3.clone().requires_grad_(),
       w2 = in.w2.clone().requires_grad_();
  std::unique_ptr<SyncCheck> check;
  if (checkSync) check = std::make_unique<SyncCheck>(in.x.device(), SyncDebug::Error);
  at::Tensor y;
  {
    Bf16Autocast cast(autocast);
    y = models::moe_detail::runExperts(autocast ? x : x.to(in.w1.scalar_type()), in.counts, w1, w3, w2, how,
                                       {fp8, w1, w3, w2});
  }
  (y.to(at::kFloat) * in.g).sum().backward();
  check.reset();
  return {y.detach().to(at::kFloat), x.grad(), w1.grad().to(at::kFloat), w3.grad().to(at::kFloat),
          w2.grad().to(at::kFloat)};
}

inline void expectClose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const double norm = b.norm().item<double>(), diff = (a - b).norm().item<double>();
  const double peak = b.abs().max().item<double>(), worst = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, norm / 64) << what << ": ‖a − b‖ " << diff << " of ‖b‖ " << norm;
  EXPECT_LE(worst, peak / 16) << what << ": max |a − b| " << worst << " of max |b| " << peak;
}

// Whether grouped GEMMs run here (compute capability 9.0+, LibTorch 2.8+); says why not.
inline bool groupedRuns() {
  auto in = inputs({8}, 16, 16, at::kBFloat16);
  try {
    models::moe_detail::runExperts(in.x.to(at::kBFloat16), in.counts, in.w1, in.w3, in.w2, ExpertGemm::Grouped);
    return true;
  } catch (const Error& e) {
    fmt::print("SKIP: {}\n", e.what());
    return false;
  }
}

// Skips the test, saying why, where grouped GEMMs cannot run.
#define REQUIRE_GROUPED()                                                \
  TESSERA_REQUIRE_CUDA_LIBTORCH();                                       \
  do {                                                                   \
    if (!groupedRuns()) GTEST_SKIP() << "grouped GEMMs cannot run here"; \
  } while (0)

// A timed loop of `fn` (ms per call, after 3 warm-ups).
template <typename F>
double timeMs(const at::Device& dev, F fn, int n = 10) {
  for (int i = 0; i < 3; ++i) fn();
  synchronizeDevice(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn();
  synchronizeDevice(dev);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
}

}  // namespace tessera::moe_gpu_test
