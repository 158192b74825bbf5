// kernels/fp8.h's CPU path, the reference its CUDA kernels are checked against on a GPU
// (tests/kernels/test_fp8_gpu.cpp): fp8Quantize's codes and scales are quantize.h's reference
// casts', per tensor, per row and per column (the last through the reference's transposed rows);
// fp8Gemm of the codes is the GEMM of fake_quant.h's dequantized tensors (what the CPU layout tests
// train with); accumulation adds into the given tensor; bad operands are clear errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tessera/common/error.h"
#include "tessera/fp8/fake_quant.h"
#include "tessera/fp8/quantize.h"
#include "kernels/fp8.h"

using namespace tessera;
using namespace tessera::kernels;
using fp8::Axis;
using fp8::Format;

namespace {
at::Tensor seeded(std::vector<int64_t> shape, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g) * 3;
}
}  // namespace

TEST(Fp8Ops, QuantizeIsTheReferenceCast) {
  const auto x = seeded({33, 20}, 1);
  for (auto f : {Format::E4M3, Format::E5M2}) {
    const auto ref = fp8::quantizeReference(x, f, fp8::Scaling::Tensorwise, true);
    Fp8QuantizeOptions o;
    o.transposed = true;
    const auto q = fp8Quantize(x, f, Axis::Tensor, o);
    EXPECT_TRUE(at::equal(q.codes, ref.codes)) << fp8::name(f);
    EXPECT_TRUE(at::equal(q.codesT, ref.codesT)) << fp8::name(f);
    EXPECT_TRUE(at::equal(q.scaleInv, ref.scaleInv)) << fp8::name(f);
    const auto rows = fp8Quantize(x, f, Axis::Rows);
    const auto refRows = fp8::quantizeReference(x, f, fp8::Scaling::Rowwise, true);
    EXPECT_TRUE(at::equal(rows.codes, refRows.codes)) << fp8::name(f);
    EXPECT_TRUE(at::equal(rows.scaleInv, refRows.scaleInv.view({-1}))) << fp8::name(f);
    // Per column: the reference's rows of xᵀ.
    o.codes = false;
    const auto cols = fp8Quantize(x, f, Axis::Cols, o);
    EXPECT_FALSE(cols.codes.defined());
    EXPECT_TRUE(at::equal(cols.codesT, refRows.codesT)) << fp8::name(f);
    EXPECT_TRUE(at::equal(cols.scaleInv, refRows.scaleInvT.view({-1}))) << fp8::name(f);
  }
}

TEST(Fp8Ops, GemmOfCodesIsTheGemmOfTheFakeQuantizedTensors) {
  const auto x = seeded({24, 40}, 2), w = seeded({16, 40}, 3);
  for (auto axis : {Axis::Tensor, Axis::Rows}) {
    const auto qx = fp8Quantize(x, Format::E5M2, axis), qw = fp8Quantize(w, Format::E4M3, axis);
    const auto got = fp8Gemm(qx.codes, qx.scaleInv, Format::E5M2, qw.codes, qw.scaleInv, Format::E4M3, at::kFloat);
    const auto want = fp8::fakeQuantize(x, Format::E5M2, axis).mm(fp8::fakeQuantize(w, Format::E4M3, axis).t());
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
    // The FP8 product is not the float32 one.
    EXPECT_GT((got - x.mm(w.t())).abs().max().item<double>(), 1e-3);
    auto acc = at::full({24, 16}, 2.0f);
    Fp8GemmOptions o;
    o.accumulate = acc;
    fp8Gemm(qx.codes, qx.scaleInv, Format::E5M2, qw.codes, qw.scaleInv, Format::E4M3, at::kFloat, o);
    EXPECT_TRUE(at::allclose(acc, want + 2, 1e-5, 1e-5));
  }
}

TEST(Fp8Ops, BadOperandsAreClearErrors) {
  const auto q = fp8Quantize(seeded({16, 32}, 4), Format::E5M2, Axis::Tensor);
  auto expectError = [](auto&& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error containing '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expectError([&] { fp8Gemm(q.codes, q.scaleInv, Format::E5M2, q.codes, q.scaleInv, Format::E5M2, at::kFloat); },
              "E5M2 × E5M2");
  expectError([&] { fp8Gemm(q.codes, q.scaleInv, Format::E5M2, q.codes.t(), q.scaleInv, Format::E4M3, at::kFloat); },
              "kernels::fp8Gemm: b must be contiguous uint8 FP8 codes [n, k]");
  expectError([&] { fp8Quantize(at::ones({4, 4}, at::kLong), Format::E4M3, Axis::Tensor); }, "kernels::fp8Quantize: x");
}
