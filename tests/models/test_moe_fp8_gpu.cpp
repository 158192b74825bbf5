// The MoE experts' FP8 forward GEMMs (fp8GroupedLinear, src/models/moe/grouped.h) on one GPU:
// - the output equals the GEMM of the decoded E4M3 codes times their rowwise factors (to bf16
//   rounding and fast accumulation), which the bf16 GEMM does not (so the test fails if FP8 silently
//   did not run); the input gradient equals the bf16 path's bit for bit, the weight gradient to
//   accumulation order; runExperts with fp8 syncs the host nowhere and stays near bf16;
// - measurements, printed, not checked: where FP8's forward time goes at OLMoE's expert shape (casts,
//   GEMMs), and every way's forward + backward at OLMoE's and a Mixtral-like shape, with the step's
//   caches closed and open.
// Helpers and tolerance: moe_gpu_util.h. Skips visibly without a GPU, a CUDA LibTorch, compute 9.0+ or
// at::_scaled_grouped_mm.
#include "common/compat.h"
#include "kernels/fp8.h"
#include "models/moe_gpu_util.h"
#include "parallel/tensor/fp8_weight_cache.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::moe_gpu_test;

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
        "fp8 pieces ({} counts): cast x [{}, {}] rows {:.3f} ms; cast w bf16 [{}, {}] rows {:.3f} ms; w float32 "
        "{:.3f} "
        "ms; x tensorwise {:.3f} ms; scaled grouped GEMM {:.3f} ms (no fast accumulation {:.3f}); bf16 grouped "
        "GEMM "
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
          "moe experts {}{} at {} (E {} d {} f {} rows {}, fp32 weights, bf16 autocast): forward+backward {:.2f} "
          "ms "
          "({:.0f} TFLOP/s of expert GEMMs)\n",
          way == 0 ? "loop"
          : fp8    ? "grouped, FP8 forwards"
                   : "grouped bf16",
          cached ? ", cached weights" : "", s.name, s.el, s.d, s.f, s.rows, ms, tflop / (ms / 1e3));
    }
  }
}
