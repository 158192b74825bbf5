// fp8::encode / decode (src/fp8/format.h) on a table of edge values worked out by hand from the
// formats' definitions (zeros, subnormals, ties to even, the largest values, overflow both ways,
// infinities, NaN), every one of the 256 patterns decoded and encoded back, and a sweep checking
// that each rounding is to a nearest neighbour; then the scaled casts (src/fp8/quantize.h):
// scales, codes, the transposed codes, counts and the dequantized error bound.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tessera/common/error.h"
#include "tessera/fp8/fake_quant.h"
#include "tessera/fp8/format.h"
#include "tessera/fp8/quantize.h"

using namespace tessera::fp8;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
float p2(int e) { return std::ldexp(1.0f, e); }

struct Row {
  float x;
  uint8_t e4m3Sat, e4m3NoSat, e5m2Sat, e5m2NoSat;
  const char* what;
};

// Bit patterns: E4M3 S.EEEE.MMM (bias 7), E5M2 S.EEEEE.MM (bias 15).
const Row kTable[] = {
    {0.0f, 0x00, 0x00, 0x00, 0x00, "zero"},
    {-0.0f, 0x80, 0x80, 0x80, 0x80, "negative zero keeps its sign"},
    {1.0f, 0x38, 0x38, 0x3c, 0x3c, "one"},
    {-2.0f, 0xc0, 0xc0, 0xc0, 0xc0, "minus two"},
    {1.0625f, 0x38, 0x38, 0x3c, 0x3c, "1 + 2^-4: E4M3 tie between 1 and 1.125 goes to even (1)"},
    {1.1875f, 0x3a, 0x3a, 0x3d, 0x3d, "1.1875: E4M3 tie between 1.125 and 1.25 to even (1.25); E5M2 nearest 1.25"},
    {1.125f, 0x39, 0x39, 0x3c, 0x3c, "1.125: exact in E4M3; E5M2 tie between 1 and 1.25 goes to even (1)"},
    {1.375f, 0x3b, 0x3b, 0x3e, 0x3e, "1.375: E5M2 tie between 1.25 and 1.5 goes to even (1.5)"},
    {p2(-6), 0x08, 0x08, 0x24, 0x24, "E4M3's smallest normal"},
    {p2(-9), 0x01, 0x01, 0x18, 0x18, "E4M3's smallest subnormal"},
    {p2(-10), 0x00, 0x00, 0x14, 0x14, "half E4M3's smallest subnormal: a tie to even zero"},
    {1.5f * p2(-10), 0x01, 0x01, 0x16, 0x16, "0.75 x E4M3's smallest subnormal rounds up to it"},
    {3.0f * p2(-10), 0x02, 0x02, 0x1a, 0x1a, "1.5 x the smallest subnormal: tie between 1 and 2 units to even (2)"},
    {p2(-16), 0x00, 0x00, 0x01, 0x01, "E5M2's smallest subnormal (zero in E4M3)"},
    {p2(-17), 0x00, 0x00, 0x00, 0x00, "half E5M2's smallest subnormal: tie to even zero"},
    {-p2(-17) * 1.5f, 0x80, 0x80, 0x81, 0x81, "minus 0.75 x E5M2's smallest subnormal"},
    {448.0f, 0x7e, 0x7e, 0x5f, 0x5f, "E4M3's largest (S.1111.110); E5M2 448 = 1.75 x 2^8"},
    {464.0f, 0x7e, 0x7e, 0x5f, 0x5f, "464: E4M3 tie between 448 and 480 (beyond) to even 448; E5M2 nearest 448"},
    {465.0f, 0x7e, 0x7f, 0x5f, 0x5f, "465 rounds to 480 beyond E4M3's range: saturates, or NaN"},
    {-1000.0f, 0xfe, 0xff, 0xe4, 0xe4, "-1000: E4M3 -448 or NaN; E5M2 -1024"},
    {57344.0f, 0x7e, 0x7f, 0x7b, 0x7b, "E5M2's largest (S.11110.11)"},
    {61440.0f, 0x7e, 0x7f, 0x7b, 0x7c, "61440: E5M2 tie between 57344 (odd) and 65536 (even, beyond): overflows"},
    {61441.0f, 0x7e, 0x7f, 0x7b, 0x7c, "just above: E5M2 saturates, or infinity"},
    {kInf, 0x7e, 0x7f, 0x7b, 0x7c, "infinity: largest, or E4M3 NaN / E5M2 infinity"},
    {-kInf, 0xfe, 0xff, 0xfb, 0xfc, "minus infinity"},
    {kNaN, 0x7f, 0x7f, 0x7e, 0x7e, "NaN"},
    {-kNaN, 0xff, 0xff, 0xfe, 0xfe, "NaN with its sign"},
};
}  // namespace

TEST(Fp8Format, EdgeValueTable) {
  for (const auto& r : kTable) {
    EXPECT_EQ(encode(r.x, Format::E4M3, Overflow::Saturate), r.e4m3Sat) << r.what;
    EXPECT_EQ(encode(r.x, Format::E4M3, Overflow::NoSaturate), r.e4m3NoSat) << r.what;
    EXPECT_EQ(encode(r.x, Format::E5M2, Overflow::Saturate), r.e5m2Sat) << r.what;
    EXPECT_EQ(encode(r.x, Format::E5M2, Overflow::NoSaturate), r.e5m2NoSat) << r.what;
  }
  EXPECT_EQ(decode(0x7e, Format::E4M3), 448.0f);
  EXPECT_EQ(decode(0x7b, Format::E5M2), 57344.0f);
  EXPECT_EQ(decode(0x01, Format::E4M3), p2(-9));
  EXPECT_EQ(decode(0x01, Format::E5M2), p2(-16));
  EXPECT_EQ(decode(0x7c, Format::E5M2), kInf);
  EXPECT_EQ(decode(0xfc, Format::E5M2), -kInf);
  EXPECT_TRUE(std::isnan(decode(0x7f, Format::E4M3)));
  EXPECT_TRUE(std::isnan(decode(0x7d, Format::E5M2)));
  EXPECT_EQ(decode(0x78, Format::E4M3), 256.0f) << "E4M3fn uses the top exponent for finite values";
  EXPECT_EQ(maxFinite(Format::E4M3), 448.0f);
  EXPECT_EQ(maxFinite(Format::E5M2), 57344.0f);
  EXPECT_STREQ(name(Format::E5M2), "e5m2");
}

TEST(Fp8Format, EveryPatternDecodesAndEncodesBack) {
  for (auto f : {Format::E4M3, Format::E5M2}) {
    int nans = 0, infs = 0;
    for (int b = 0; b < 256; ++b) {
      const float v = decode(static_cast<uint8_t>(b), f);
      if (std::isnan(v)) {
        ++nans;
        EXPECT_TRUE(std::isnan(decode(encode(v, f), f))) << name(f) << " pattern " << b;
        continue;
      }
      if (std::isinf(v)) {
        ++infs;
        EXPECT_EQ(encode(v, f, Overflow::NoSaturate), b) << name(f) << " pattern " << b;
        continue;
      }
      EXPECT_EQ(encode(v, f, Overflow::NoSaturate), b) << name(f) << " pattern " << b << " = " << v;
      EXPECT_EQ(encode(v, f, Overflow::Saturate), b) << name(f) << " pattern " << b << " = " << v;
    }
    EXPECT_EQ(nans, f == Format::E4M3 ? 2 : 6) << name(f);
    EXPECT_EQ(infs, f == Format::E4M3 ? 0 : 2) << name(f);
  }
}

TEST(Fp8Format, RoundsToANearestValueAndTiesToEven) {
  for (auto f : {Format::E4M3, Format::E5M2}) {
    // The finite non-negative values in order (patterns 0x00.. are increasing).
    std::vector<float> vals;
    for (int b = 0; b < 128; ++b) {
      const float v = decode(static_cast<uint8_t>(b), f);
      if (std::isfinite(v)) vals.push_back(v);
    }
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> expo(-20.0f, 17.0f);
    for (int i = 0; i < 200000; ++i) {
      const float x = std::exp2(expo(gen));
      if (x > maxFinite(f)) continue;
      const float got = round(x, f);
      auto hi = std::lower_bound(vals.begin(), vals.end(), x);
      const float up = hi == vals.end() ? kInf : *hi, down = hi == vals.begin() ? 0.0f : *(hi - 1);
      const float dUp = up - x, dDown = x - down;
      if (dUp < dDown) {
        EXPECT_EQ(got, up) << name(f) << " x = " << x;
      } else if (dDown < dUp) {
        EXPECT_EQ(got, down) << name(f) << " x = " << x;
      } else {  // a tie: the even pattern
        EXPECT_TRUE(got == up || got == down) << name(f) << " x = " << x;
        EXPECT_EQ(encode(got, f) & 1, 0) << name(f) << " tie at " << x << " went to an odd pattern";
      }
      EXPECT_EQ(round(-x, f), -got) << name(f) << " symmetric at " << x;
    }
  }
}

TEST(Fp8Quantize, TensorwiseAndRowwiseScalesCodesAndCounts) {
  auto x = at::tensor({1.0f, -2.0f, 0.5f, 4.0f, 1e-9f, -8.0f, 0.0f, 3.0f}).view({2, 4});
  auto q = quantizeReference(x, Format::E4M3, Scaling::Tensorwise, /*transposed=*/true);
  ASSERT_EQ(q.scaleInv.numel(), 1);
  EXPECT_FLOAT_EQ(q.scaleInv.item<float>(), 1.0f / (448.0f / 8.0f));
  // -8 is the amax: it becomes -448 exactly; 1e-9 · 56 underflows to zero.
  EXPECT_EQ(q.codes[1][1].item<int>(), 0xfe);
  EXPECT_EQ(q.codes[1][0].item<int>(), 0x00);
  EXPECT_EQ(q.underflows.item<float>(), 2.0f) << "1e-9 once in the codes and once in the transposed codes";
  EXPECT_EQ(q.saturated.item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(q.codesT, q.codes.t().contiguous())) << "tensorwise: the same codes, transposed";
  auto back = dequantizeReference(q);
  // Within half a unit in the last place of E4M3 (2^-4 relative) for the values above the subnormals.
  auto big = x.abs() > 0.1;
  EXPECT_TRUE(at::all((back - x).abs().masked_select(big) <= x.abs().masked_select(big) * (1.0 / 16)).item<bool>());

  auto r = quantizeReference(x, Format::E5M2, Scaling::Rowwise, /*transposed=*/true);
  ASSERT_EQ(r.scaleInv.sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_FLOAT_EQ(r.scaleInv[0][0].item<float>(), 4.0f / 57344.0f);
  EXPECT_FLOAT_EQ(r.scaleInv[1][0].item<float>(), 8.0f / 57344.0f);
  EXPECT_EQ(r.codes[0][3].item<int>(), 0x7b) << "each row's amax becomes the largest value";
  ASSERT_EQ(r.scaleInvT.sizes(), (std::vector<int64_t>{4, 1})) << "the transposed codes scale x's columns";
  EXPECT_FLOAT_EQ(r.scaleInvT[3][0].item<float>(), 4.0f / 57344.0f);
  EXPECT_TRUE(at::all((dequantizeReference(r, true) - x.t()).abs().masked_select(big.t()) <=
                      x.t().abs().masked_select(big.t()) * 0.125)
                  .item<bool>());

  auto zeros = quantizeReference(at::zeros({3, 2}), Format::E4M3, Scaling::Rowwise);
  EXPECT_TRUE(at::equal(zeros.scaleInv, at::ones({3, 1}))) << "an all-zero row keeps scale 1";
  EXPECT_EQ(zeros.underflows.item<float>(), 0.0f);
}

TEST(Fp8Quantize, BadInputIsAClearError) {
  try {
    quantizeReference(at::zeros({2, 3, 4}), Format::E4M3, Scaling::Tensorwise);
    FAIL() << "a 3-D tensor was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 4] float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantizeReference(at::zeros({2, 3}, at::kInt), Format::E4M3, Scaling::Tensorwise), tessera::Error);
}

TEST(Fp8FakeQuantize, EqualsTheReferenceCastBitForBitAndCounts) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  auto x = at::randn({6, 10}, g) * at::rand({6, 1}, g) * 100;
  x[2][3] = 1e-12;  // underflows in both formats
  tessera::fp8::takeCounts();
  for (auto f : {Format::E4M3, Format::E5M2}) {
    const auto tw = quantizeReference(x, f, Scaling::Tensorwise), rw = quantizeReference(x, f, Scaling::Rowwise),
               cw = quantizeReference(x.t().contiguous(), f, Scaling::Rowwise);
    EXPECT_TRUE(at::equal(tessera::fp8::fakeQuantize(x, f, tessera::fp8::Axis::Tensor), dequantizeReference(tw)))
        << name(f);
    EXPECT_TRUE(at::equal(tessera::fp8::fakeQuantize(x, f, tessera::fp8::Axis::Rows), dequantizeReference(rw)))
        << name(f);
    EXPECT_TRUE(at::equal(tessera::fp8::fakeQuantize(x, f, tessera::fp8::Axis::Cols), dequantizeReference(cw).t()))
        << name(f);
  }
  const auto c = tessera::fp8::takeCounts();
  EXPECT_EQ(c.values, 6 * 60);
  EXPECT_EQ(c.underflows, 6) << "1e-12 in each of the six casts";
  EXPECT_EQ(c.saturated, 0);
  EXPECT_EQ(tessera::fp8::takeCounts().values, 0) << "taking the counts resets them";
  // A 3-D tensor is seen as [rows, last dim]; the result keeps its shape.
  auto x3 = x.view({2, 3, 10});
  EXPECT_TRUE(at::equal(tessera::fp8::fakeQuantize(x3, Format::E4M3, tessera::fp8::Axis::Rows).view({6, 10}),
                        tessera::fp8::fakeQuantize(x, Format::E4M3, tessera::fp8::Axis::Rows)));
  EXPECT_EQ(tessera::fp8::parseRecipe("rowwise"), tessera::fp8::Recipe::Rowwise);
  EXPECT_THROW(tessera::fp8::parseRecipe("blockwise"), tessera::Error);
}
