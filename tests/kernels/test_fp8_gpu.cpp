// The FP8 casts and cuBLASLt's FP8 GEMM (kernels/fp8.h) on one GPU:
// - every cast (tensorwise, per row, per column; codes and transposed codes; float32, bfloat16
//   and float16 inputs; E4M3 and E5M2) equals the CPU reference bit for bit, scales and counts
//   included, on odd shapes with zeros, subnormal-range values, NaN, ±inf and values that round
//   above the largest finite one;
// - the GEMM (tensorwise and with row/column scales, E4M3 × E4M3 and E5M2 × E4M3, bf16 and
//   float32 outputs, accumulating into float32) against the GEMM of the dequantized codes in
//   float64, within the bound of float32 accumulation over k products (fast accumulation: a
//   looser one), and the output dtype's rounding;
// - shapes cuBLASLt's FP8 kernels cannot take and E5M2 × E5M2 are clear errors.
// Skips visibly without a GPU or a CUDA LibTorch.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/error.h"
#include "kernels/fp8.h"

using namespace tessera;
using namespace tessera::kernels;
using fp8::Axis;
using fp8::Format;

namespace {

const at::Device kGpu(at::kCUDA, 0);

// Values over many binades, with the edge cases sprinkled in.
at::Tensor edgy(int64_t rows, int64_t cols, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = at::randn({rows, cols}, g) * at::pow(2.0, at::randint(-20, 12, {rows, cols}, g).to(at::kFloat));
  auto flat = x.view({-1});
  const int64_t n = flat.numel();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials{0.f, -0.f, 1e-30f, -1e-38f, inf, -inf, std::nanf("")};
  for (size_t i = 0; i < specials.size() && static_cast<int64_t>(7 * i + 3) < n; ++i) flat[7 * i + 3] = specials[i];
  if (rows > 2) x[1].zero_();  // a row of zeros: amax 0, scale 1
  return x;
}

void expectSame(const at::Tensor& gpu, const at::Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  auto g = gpu.cpu();
  ASSERT_EQ(g.sizes(), cpu.sizes()) << what;
  if (g.scalar_type() == at::kByte) {
    const auto ne = at::ne(g, cpu).reshape({-1}).nonzero();
    std::string first;
    if (ne.numel()) {
      const int64_t i = ne[0].item<int64_t>();
      first = fmt::format(" (first at flat index {}: gpu {:#04x}, cpu {:#04x})", i, g.reshape({-1})[i].item<int>(),
                          cpu.reshape({-1})[i].item<int>());
    }
    EXPECT_TRUE(at::equal(g, cpu)) << what << ": " << ne.numel() << " codes differ" << first;
  } else {  // float scales: equal bit for bit (NaN never appears in a scale)
    EXPECT_TRUE(at::equal(g.view(at::kInt), cpu.view(at::kInt))) << what << ": max |diff| "
                                                                 << (g - cpu).abs().max().item<double>();
  }
}

}  // namespace

TEST(Fp8Gpu, CastsEqualTheCpuReferenceBitForBit) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 53}, {64, 48}, {300, 129}}) {
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto f : {Format::E4M3, Format::E5M2}) {
        for (auto axis : {Axis::Tensor, Axis::Rows, Axis::Cols}) {
          const auto x = edgy(rows, cols, static_cast<int>(rows * 7 + cols)).to(dt);
          Fp8QuantizeOptions o;
          o.transposed = true;
          takeFp8Counts();
          const auto cpu = fp8Quantize(x, f, axis, o);
          const auto cpuCounts = takeFp8Counts();
          const auto gpu = fp8Quantize(x.to(kGpu), f, axis, o);
          const auto gpuCounts = takeFp8Counts();
          const std::string what = fmt::format("[{}, {}] {} {} axis {}", rows, cols, c10::toString(dt), fp8::name(f),
                                               static_cast<int>(axis));
          expectSame(gpu.amax, cpu.amax, what + " amax");
          expectSame(gpu.scaleInv, cpu.scaleInv, what + " scaleInv");
          expectSame(gpu.codes, cpu.codes, what + " codes");
          if (!at::equal(gpu.codes.cpu(), cpu.codes)) {
            const int64_t i = at::ne(gpu.codes.cpu(), cpu.codes).reshape({-1}).nonzero()[0].item<int64_t>();
            const float v = x.reshape({-1}).to(at::kFloat)[i].item<float>();
            ADD_FAILURE() << what << ": input at " << i << " is " << fmt::format("{:a} ({:g})", v, v) << ", scale inv "
                          << fmt::format("{:a}", cpu.scaleInv.reshape({-1})[0].item<float>());
          }
          expectSame(gpu.codesT, cpu.codesT, what + " transposed codes");
          EXPECT_EQ(gpuCounts.values, cpuCounts.values) << what;
          EXPECT_EQ(gpuCounts.underflows, cpuCounts.underflows) << what;
          EXPECT_EQ(gpuCounts.saturated, cpuCounts.saturated) << what;
        }
      }
    }
  }
}

TEST(Fp8Gpu, AGivenAmaxIsUsedAsIs) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const auto x = at::randn({32, 64});
  Fp8QuantizeOptions o;
  o.amax = at::full({1}, 8.0f);
  const auto cpu = fp8Quantize(x, Format::E4M3, Axis::Tensor, o);
  o.amax = o.amax.to(kGpu);
  const auto gpu = fp8Quantize(x.to(kGpu), Format::E4M3, Axis::Tensor, o);
  expectSame(gpu.codes, cpu.codes, "codes with amax 8");
  EXPECT_FLOAT_EQ(gpu.scaleInv.cpu().item<float>(), 8.0f / 448.0f);
}

TEST(Fp8Gpu, GemmMatchesTheDequantizedProduct) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const int64_t m = 96, n = 80, k = 256;
  for (bool outer : {false, true}) {
    for (auto af : {Format::E4M3, Format::E5M2}) {
      for (bool fast : {false, true}) {
        const auto axis = outer ? Axis::Rows : Axis::Tensor;
        const auto qa = fp8Quantize(at::randn({m, k}).to(kGpu), af, axis);
        const auto qb = fp8Quantize(at::randn({n, k}).to(kGpu), Format::E4M3, axis);
        // float64 reference from the same codes (the CPU path decodes them).
        const auto ref = fp8Gemm(qa.codes.cpu(), qa.scaleInv.cpu(), af, qb.codes.cpu(), qb.scaleInv.cpu(),
                                 Format::E4M3, at::kFloat)
                             .to(at::kDouble);
        Fp8GemmOptions o;
        o.fastAccum = fast;
        const auto got32 = fp8Gemm(qa.codes, qa.scaleInv, af, qb.codes, qb.scaleInv, Format::E4M3, at::kFloat, o);
        const auto gotBf = fp8Gemm(qa.codes, qa.scaleInv, af, qb.codes, qb.scaleInv, Format::E4M3, at::kBFloat16, o);
        // Relative to the largest output: Hopper's FP8 tensor cores accumulate with fewer bits than
        // float32 between promotions (measured: 3e-4 of the largest value at k = 256 without fast
        // accumulation); a wrong scale or code would be off by far more (E4M3's half step: 6 %).
        const double scale = ref.abs().max().item<double>();
        const double tol32 = (fast ? 5e-3 : 1e-3) * scale;
        const std::string what = fmt::format("{} {} × e4m3 fast {}", outer ? "rowwise" : "tensorwise", fp8::name(af), fast);
        EXPECT_LE((got32.cpu().to(at::kDouble) - ref).abs().max().item<double>(), tol32) << what << " float32";
        EXPECT_LE((gotBf.cpu().to(at::kDouble) - ref).abs().max().item<double>(), tol32 + scale / 128) << what << " bf16";
        // Accumulating into float32.
        auto acc = at::ones({m, n}, at::TensorOptions().device(kGpu));
        Fp8GemmOptions a;
        a.accumulate = acc;
        fp8Gemm(qa.codes, qa.scaleInv, af, qb.codes, qb.scaleInv, Format::E4M3, at::kFloat, a);
        EXPECT_LE((acc.cpu().to(at::kDouble) - 1.0 - ref).abs().max().item<double>(), tol32 + 1e-6) << what << " +=";
      }
    }
  }
}

TEST(Fp8Gpu, ShapesCublasLtCannotTakeAreClearErrors) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const auto a = fp8Quantize(at::randn({32, 24}).to(kGpu), Format::E4M3, Axis::Tensor);
  const auto b = fp8Quantize(at::randn({16, 24}).to(kGpu), Format::E4M3, Axis::Tensor);
  try {
    fp8Gemm(a.codes, a.scaleInv, Format::E4M3, b.codes, b.scaleInv, Format::E4M3, at::kBFloat16);
    ADD_FAILURE() << "k = 24 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[32, 24]"), std::string::npos) << e.what();
  }
  const auto g = fp8Quantize(at::randn({32, 32}).to(kGpu), Format::E5M2, Axis::Tensor);
  try {
    fp8Gemm(g.codes, g.scaleInv, Format::E5M2, g.codes, g.scaleInv, Format::E5M2, at::kBFloat16);
    ADD_FAILURE() << "E5M2 × E5M2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("E5M2 × E5M2"), std::string::npos) << e.what();
  }
}
