// The MoE experts' grouped GEMMs (src/models/moe/grouped.h) against the per-expert loop on one GPU:
// - runExperts both ways on the same inputs, under CUDA autocast to bf16 with float32 weights (the
//   trainer's DDP case) and with bf16 weights and no autocast (FSDP's gathered weights): the output
//   and the gradients of x, w1, w3, w2, for uneven counts with experts of no tokens, every row on
//   one expert, and equal counts; an empty expert's weight gradients are exactly zero;
// - the grouped path synchronizes the host with the device nowhere, forward or backward (SyncCheck);
// - shapes the kernel cannot take (d not a multiple of 8) fall back to the loop under Auto;
// - the whole MoE layer with TESSERA_MOE_GROUPED_GEMM=0 and unset: the same outputs and gradients,
//   and no host sync in its grouped forward and backward (one ep rank, dropless);
// - FP8 forward GEMMs (fp8GroupedLinear): the output equals the GEMM of the decoded E4M3 codes
//   times their rowwise factors (to bf16 rounding and fast accumulation), which the bf16 GEMM does
//   not (so the test fails if FP8 silently did not run); the input gradient equals the bf16 path's
//   bit for bit, the weight gradient to accumulation order; runExperts with fp8
//   syncs the host nowhere and stays near bf16;
// - the ways' forward + backward time at OLMoE's and a Mixtral-like expert shape (printed, not checked).
// Tolerance: both ways multiply bf16 operands with float32 accumulation and round h1, h3, h and y to
// bf16; they differ in summation order (tiles), so an element may land on the neighbouring bf16
// value at each rounding (2^-8 relative). We allow ‖a − b‖ ≤ 2^-6 ‖b‖ (Frobenius) and
// max |a − b| ≤ 2^-4 max |b|: a wrong group (rows through another expert, a missed row) is off by
// the size of the values themselves. Skips visibly without a GPU, a CUDA LibTorch or compute 9.0+.
#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "comm/gpu/gpu_test_util.h"
#include "common/compat.h"
#include "kernels/fp8.h"
#include "models/moe/grouped.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "tessera/common/autocast.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"
#include "tessera/models/moe.h"

using namespace tessera;
using namespace tessera::models;
using moe_detail::ExpertGemm;

namespace {

struct Grads {
  at::Tensor y, x, w1, w3, w2;
};

struct Inputs {
  at::Tensor x, counts, w1, w3, w2, g;
};

Inputs inputs(std::vector<int64_t> counts, int64_t d, int64_t f, at::ScalarType wdt) {
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
Grads run(const Inputs& in, ExpertGemm how, bool autocast, bool checkSync = false, bool fp8 = false) {
  auto x = in.x.clone().requires_grad_(), w1 = in.w1.clone().requires_grad_(), w3 = in.w3.clone().requires_grad_(),
       w2 = in.w2.clone().requires_grad_();
  std::unique_ptr<SyncCheck> check;
  if (checkSync) check = std::make_unique<SyncCheck>(in.x.device(), SyncDebug::Error);
  at::Tensor y;
  {
    Bf16Autocast cast(autocast);
    y = moe_detail::runExperts(autocast ? x : x.to(in.w1.scalar_type()), in.counts, w1, w3, w2, how, {fp8, w1, w3, w2});
  }
  (y.to(at::kFloat) * in.g).sum().backward();
  check.reset();
  return {y.detach().to(at::kFloat), x.grad(), w1.grad().to(at::kFloat), w3.grad().to(at::kFloat),
          w2.grad().to(at::kFloat)};
}

void expectClose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  const double norm = b.norm().item<double>(), diff = (a - b).norm().item<double>();
  const double peak = b.abs().max().item<double>(), worst = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, norm / 64) << what << ": ‖a − b‖ " << diff << " of ‖b‖ " << norm;
  EXPECT_LE(worst, peak / 16) << what << ": max |a − b| " << worst << " of max |b| " << peak;
}

// Whether grouped GEMMs run here (compute capability 9.0+, LibTorch 2.8+); says why not.
bool groupedRuns() {
  auto in = inputs({8}, 16, 16, at::kBFloat16);
  try {
    moe_detail::runExperts(in.x.to(at::kBFloat16), in.counts, in.w1, in.w3, in.w2, ExpertGemm::Grouped);
    return true;
  } catch (const Error& e) {
    fmt::print("SKIP: {}\n", e.what());
    return false;
  }
}

#define REQUIRE_GROUPED()                                                \
  TESSERA_REQUIRE_CUDA_LIBTORCH();                                       \
  do {                                                                   \
    if (!groupedRuns()) GTEST_SKIP() << "grouped GEMMs cannot run here"; \
  } while (0)

}  // namespace

TEST(MoeGroupedGemmGpu, MatchesTheLoopForwardAndBackward) {
  REQUIRE_GROUPED();
  const std::vector<std::vector<int64_t>> cases = {
      {100, 0, 37, 250, 1, 64, 0, 20}, {0, 0, 0, 472, 0, 0, 0, 0}, {64, 64, 64, 64, 64, 64, 64, 64}};
  for (bool autocast : {true, false}) {  // float32 weights under autocast; bf16 weights without
    for (const auto& counts : cases) {
      const auto in = inputs(counts, 256, 128, autocast ? at::kFloat : at::kBFloat16);
      const auto loop = run(in, ExpertGemm::Loop, autocast), grouped = run(in, ExpertGemm::Grouped, autocast);
      const auto tag = fmt::format("autocast {} counts [{}]", autocast, fmt::join(counts, ", "));
      expectClose(grouped.y, loop.y, tag + " y");
      expectClose(grouped.x, loop.x, tag + " x.grad");
      expectClose(grouped.w1, loop.w1, tag + " w1.grad");
      expectClose(grouped.w3, loop.w3, tag + " w3.grad");
      expectClose(grouped.w2, loop.w2, tag + " w2.grad");
      for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] != 0) continue;
        for (const auto* w : {&grouped.w1, &grouped.w3, &grouped.w2}) {
          EXPECT_TRUE((*w)[static_cast<int64_t>(e)].eq(0).all().item<bool>()) << tag << ": expert " << e;
        }
      }
    }
  }
}

TEST(MoeGroupedGemmGpu, NoHostSynchronization) {
  REQUIRE_GROUPED();
  const auto in = inputs({100, 0, 37, 250, 1, 64, 0, 20}, 256, 128, at::kFloat);
  run(in, ExpertGemm::Grouped,
      true);  // warm-up: kernels loaded, autocast and allocator caches
  EXPECT_NO_THROW(run(in, ExpertGemm::Grouped, true, /*checkSync=*/true));
}

TEST(MoeGroupedGemmGpu, ShapesTheKernelCannotTakeFallBackToTheLoop) {
  REQUIRE_GROUPED();
  const auto in = inputs({5, 0, 7}, 60, 32, at::kFloat);  // d 60: rows of 120 bytes
  const auto loop = run(in, ExpertGemm::Loop, true), autoWay = run(in, ExpertGemm::Auto, true);
  EXPECT_TRUE(autoWay.y.equal(loop.y));
  EXPECT_THROW(run(in, ExpertGemm::Grouped, true), Error);
}

TEST(MoeGroupedGemmGpu, TheLayerWithAndWithoutGroupedGemms) {
  REQUIRE_GROUPED();
  auto c = presetConfig("moe-tiny");
  c.d = 128, c.moe.expertFfn = 64, c.moe.topK = 2, c.moe.auxLossCoef = 0.01;
  Moe m(c, 1, MoeOptions{});
  m->to(at::Device(at::kCUDA, 0));
  at::manual_seed(3);
  auto x0 = at::randn({4, 96, c.d}, at::kCUDA);
  auto pass = [&](bool checkSync) {
    auto x = x0.clone().requires_grad_();
    at::Tensor y;
    {
      std::unique_ptr<SyncCheck> check;  // grouped, one ep rank, dropless: no host sync, forward or backward
      if (checkSync) check = std::make_unique<SyncCheck>(x0.device(), SyncDebug::Error);
      {
        Bf16Autocast cast(true);
        y = m->forward(x);
      }
      y.to(at::kFloat).square().sum().backward();
    }
    std::vector<at::Tensor> out{y.detach().to(at::kFloat), x.grad()};
    for (auto& p : m->params("")) {
      out.push_back(p.tensor.grad().clone());
      p.tensor.mutable_grad().reset();
    }
    return out;
  };
  ::setenv("TESSERA_MOE_GROUPED_GEMM", "0", 1);
  const auto loop = pass(false);
  ::unsetenv("TESSERA_MOE_GROUPED_GEMM");
  pass(false);  // warm-up: autocast and allocator caches
  for (const auto& p : m->params("")) p.tensor.mutable_grad().reset();
  std::vector<at::Tensor> grouped;
  EXPECT_NO_THROW(grouped = pass(true));
  ASSERT_EQ(grouped.size(), loop.size());
  for (size_t i = 0; i < loop.size(); ++i) expectClose(grouped[i], loop[i], fmt::format("layer tensor {}", i));
}

TEST(MoeGroupedGemmGpu, Fp8ForwardIsTheGemmOfItsCodes) {
  REQUIRE_GROUPED();
  if (!compat::kHaveScaledGroupedMm) GTEST_SKIP() << "no at::_scaled_grouped_mm in this LibTorch";
  const std::vector<int64_t> counts = {100, 0, 37, 250, 1, 64, 0, 20};
  const auto in = inputs(counts, 256, 128, at::kBFloat16);
  const auto offs = at::cumsum(in.counts, 0, at::kInt);
  const auto g = at::randn({in.x.size(0), 128}, in.x.options());
  auto pass = [&](bool fp8) {
    auto x = in.x.to(at::kBFloat16).requires_grad_(), w = in.w1.clone().requires_grad_();
    auto y = fp8 ? moe_detail::fp8GroupedLinear(x, w, offs) : compat::groupedMm(x, w.transpose(1, 2), offs);
    (y.to(at::kFloat) * g).sum().backward();
    return Grads{y.detach().to(at::kFloat), x.grad(), w.grad(), {}, {}};
  };
  const auto f8 = pass(true), bf = pass(false);
  // The reference: the decoded codes times their factors, one float32 GEMM per expert.
  auto decode = [](const kernels::Fp8Codes& q) { return compat::e4m3ToFloat(q.codes) * q.scaleInv.unsqueeze(1); };
  const auto x = decode(kernels::fp8Quantize(in.x.to(at::kBFloat16), fp8::Format::E4M3, fp8::Axis::Rows));
  const auto w =
      decode(kernels::fp8Quantize(in.w1.reshape({-1, 256}), fp8::Format::E4M3, fp8::Axis::Rows)).view({8, 128, 256});
  std::vector<at::Tensor> parts;
  for (int64_t e = 0, at0 = 0; e < 8; at0 += counts[e], ++e) parts.push_back(x.narrow(0, at0, counts[e]).mm(w[e].t()));
  const auto ref = at::cat(parts);
  expectClose(f8.y, ref, "fp8 y against its codes' GEMM");
  const double off = (bf.y - ref).norm().item<double>() / ref.norm().item<double>();
  EXPECT_GT(off, 1.0 / 64) << "the bf16 GEMM is as near the codes' GEMM as FP8 is: the test cannot tell them apart";
  EXPECT_TRUE(f8.x.equal(bf.x)) << "x.grad: " << (f8.x - bf.x).abs().max().item<double>();
  // w.grad: the same sums with the operands swapped (gyᵀ·x, w's layout; autograd's is (xᵀ·gy)ᵀ): equal
  // up to the kernel's accumulation order.
  expectClose(f8.w1, bf.w1, "w.grad");
}

TEST(MoeGroupedGemmGpu, Fp8ExpertsThroughRunExperts) {
  REQUIRE_GROUPED();
  if (!compat::kHaveScaledGroupedMm) GTEST_SKIP() << "no at::_scaled_grouped_mm in this LibTorch";
  const auto in = inputs({100, 0, 37, 250, 1, 64, 0, 20}, 256, 128, at::kFloat);
  run(in, ExpertGemm::Grouped, true, false, true);  // warm-up
  Grads f8, bf = run(in, ExpertGemm::Grouped, true);
  EXPECT_NO_THROW(f8 = run(in, ExpertGemm::Grouped, true, /*checkSync=*/true, /*fp8=*/true));
  // E4M3 keeps 3 bits of mantissa: the three GEMMs' outputs move by a few percent, not more.
  for (auto [a, b, what] : {std::tuple{f8.y, bf.y, "y"},
                            {f8.x, bf.x, "x.grad"},
                            {f8.w1, bf.w1, "w1.grad"},
                            {f8.w3, bf.w3, "w3.grad"},
                            {f8.w2, bf.w2, "w2.grad"}}) {
    const double rel = (a - b).norm().item<double>() / b.norm().item<double>();
    EXPECT_LT(rel, 0.1) << what;
    EXPECT_GT(rel, 0.0) << what << ": FP8 did not run";
  }
}

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

TEST(MoeGroupedGemmGpu, Fp8PiecesAtOlmoeShape) {  // a measurement, printed: where FP8's forward time goes
  REQUIRE_GROUPED();
  if (!compat::kHaveScaledGroupedMm) GTEST_SKIP() << "no at::_scaled_grouped_mm in this LibTorch";
  const int64_t el = 64, d = 2048, f = 1024, rows = 4096 * 8;
  at::manual_seed(11);
  for (bool even : {false, true}) {
    const auto counts = even ? std::vector<int64_t>(el, rows / el)
                             : moe_detail::hostCounts(at::bincount(at::randint(el, {rows}, at::kLong), {}, el));
    const auto in = inputs(counts, d, f, at::kBFloat16);
    const auto dev = in.x.device();
    const auto x = in.x.to(at::kBFloat16);
    const auto offs = at::cumsum(in.counts, 0, at::kInt);
    const auto qx = kernels::fp8Quantize(x, fp8::Format::E4M3, fp8::Axis::Rows);
    const auto qw = kernels::fp8Quantize(in.w1.reshape({-1, d}), fp8::Format::E4M3, fp8::Axis::Rows);
    const auto wf = in.w1.to(at::kFloat);
    fmt::print(
        "fp8 pieces ({} counts): cast x [{}, {}] rows {:.3f} ms; cast w bf16 [{}, {}] rows {:.3f} ms; w float32 {:.3f} "
        "ms; x tensorwise {:.3f} ms; scaled grouped GEMM {:.3f} ms (no fast accumulation {:.3f}); bf16 grouped GEMM "
        "{:.3f} ms\n",
        even ? "even" : "random", rows, d,
        timeMs(dev, [&] { kernels::fp8Quantize(x, fp8::Format::E4M3, fp8::Axis::Rows); }), el * f, d,
        timeMs(dev,
               [&] {
                 kernels::fp8Quantize(in.w1.reshape({-1, d}), fp8::Format::E4M3, fp8::Axis::Rows);
               }),
        timeMs(dev,
               [&] {
                 kernels::fp8Quantize(wf.reshape({-1, d}), fp8::Format::E4M3, fp8::Axis::Rows);
               }),
        timeMs(dev, [&] { kernels::fp8Quantize(x, fp8::Format::E4M3, fp8::Axis::Tensor); }),
        timeMs(dev,
               [&] {
                 compat::scaledGroupedMm(qx.codes, qx.scaleInv, qw.codes.view({el, f, d}), qw.scaleInv.view({el, f}),
                                         offs, at::kBFloat16, true);
               }),
        timeMs(dev,
               [&] {
                 compat::scaledGroupedMm(qx.codes, qx.scaleInv, qw.codes.view({el, f, d}), qw.scaleInv.view({el, f}),
                                         offs, at::kBFloat16, false);
               }),
        timeMs(dev, [&] { compat::groupedMm(x, in.w1.transpose(1, 2), offs); }));
  }
}

TEST(MoeGroupedGemmGpu, TimesAtOlmoeAndMixtralShapes) {  // a measurement, printed
  REQUIRE_GROUPED();
  struct Shape {
    const char* name;
    int64_t el, d, f, rows;
  };
  // OLMoE: 4096 tokens, top 8 of 64; Mixtral-like: 4096 tokens, top 2 of 8 (d 4096, f 14336). "cached": the
  // step's caches open, as in training (weights cast to bf16, and to FP8 codes, once for all the calls, as
  // for a step's micro-batches); else every call casts them.
  for (const auto& s : {Shape{"olmoe", 64, 2048, 1024, 4096 * 8}, Shape{"mixtral", 8, 4096, 14336, 4096 * 2}}) {
    at::manual_seed(11);
    const auto in = inputs(moe_detail::hostCounts(at::bincount(at::randint(s.el, {s.rows}, at::kLong), {}, s.el)), s.d,
                           s.f, at::kFloat);
    auto x = in.x.clone().requires_grad_(), w1 = in.w1.clone().requires_grad_(), w3 = in.w3.clone().requires_grad_(),
         w2 = in.w2.clone().requires_grad_();
    for (int way = 0; way < 5; ++way) {  // loop; grouped bf16, FP8 forwards; the same two cached
      if (way == 0 && s.el > 16) continue;
      const bool fp8 = way == 2 || way == 4, cached = way >= 3;
      if (fp8 && !compat::kHaveScaledGroupedMm) continue;
      const auto how = way == 0 ? ExpertGemm::Loop : ExpertGemm::Grouped;
      CudaAutocastCacheScope castOnce(cached);
      tp::Fp8WeightCacheScope codesOnce(cached);
      const double ms = timeMs(in.x.device(), [&] {
        at::Tensor y;
        {
          Bf16Autocast cast(true);
          y = moe_detail::runExperts(x, in.counts, w1, w3, w2, how, {fp8, w1, w3, w2});
        }
        (y.to(at::kFloat) * in.g).sum().backward();
        for (auto* t : {&x, &w1, &w3, &w2}) t->mutable_grad().reset();
      });
      const double tflop = 6.0 * 3 * s.rows * s.d * s.f / 1e12;  // forward 2·3·M·d·f, backward twice that
      fmt::print(
          "moe experts {}{} at {} (E {} d {} f {} rows {}, fp32 weights, bf16 autocast): forward+backward {:.2f} ms "
          "({:.0f} TFLOP/s of expert GEMMs)\n",
          way == 0 ? "loop"
          : fp8    ? "grouped, FP8 forwards"
                   : "grouped bf16",
          cached ? ", cached weights" : "", s.name, s.el, s.d, s.f, s.rows, ms, tflop / (ms / 1e3));
    }
  }
}
