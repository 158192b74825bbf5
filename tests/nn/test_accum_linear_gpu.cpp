// On one GPU: kernels::gemmAccumulateTN (cuBLAS, fp32 sums) against its CPU reference for
// float32 / bfloat16 / float16 inputs, odd shapes, k = 0 and overwrite; nn::linearAccumulateGrad
// under bf16 autocast over 4 micro-batches against at::linear + autograd's accumulation (the
// same autocast): forward bitwise equal; the summed weight gradient no further from the exact
// (float64 CPU) sum than the reference's, which rounds each micro-batch's gradient to bf16
// first. nn::embeddingAccumulateGrad on CUDA (deterministic, summed in float32). A stale .grad
// overwritten (nn/stale_grads.h). Skips visibly
// without a GPU or a CUDA LibTorch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/autocast.h"
#include "kernels/gemm_accumulate.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/nn/accum_linear.h"
#include "nn/accum_hook_check.h"
#include "tessera/nn/stale_grads.h"

namespace {

double maxRelErr(const at::Tensor& got, const at::Tensor& exact) {
  auto g = got.to(at::kCPU, at::kDouble), e = exact.to(at::kCPU, at::kDouble);
  return ((g - e).abs().max() / e.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

TEST(GemmAccumulateGpu, MatchesReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  struct Shape {
    int64_t m, n, k;
  };
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto s : {Shape{1, 1, 1}, Shape{33, 17, 129}, Shape{256, 512, 1000}, Shape{96, 64, 0}}) {
      for (bool overwrite : {false, true}) {
        torch::manual_seed(s.m * 7 + s.n + s.k);
        auto a = at::randn({s.k, s.m}).to(dt), b = at::randn({s.k, s.n}).to(dt);
        auto acc = at::randn({s.m, s.n});
        auto want = acc.clone();
        tessera::kernels::gemmAccumulateTNReference(want, a, b, overwrite);
        auto got = acc.to(dev);
        tessera::kernels::gemmAccumulateTN(got, a.to(dev), b.to(dev), overwrite);
        // fp32 accumulation of exactly representable products in another order.
        const double err = maxRelErr(got, want);
        EXPECT_LT(err, 1e-5) << c10::toString(dt) << " m " << s.m << " n " << s.n << " k " << s.k << " overwrite "
                             << overwrite;
      }
    }
  }
}

TEST(AccumLinearGpu, Bf16AutocastMicroBatches) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  const int64_t out = 384, in = 256, micro = 4;
  torch::manual_seed(11);
  auto w0 = at::randn({out, in}) * 0.05, b0 = at::randn({out}) * 0.05;
  auto wMine = w0.to(dev).requires_grad_(true), bMine = b0.to(dev).requires_grad_(true);
  auto wRef = w0.to(dev).requires_grad_(true), bRef = b0.to(dev).requires_grad_(true);
  auto exactW = at::zeros({out, in}, at::kDouble), exactB = at::zeros({out}, at::kDouble);
  for (int m = 0; m < micro; ++m) {
    auto x = at::randn({4, 128, in}).to(dev);
    auto probe = at::randn({4, 128, out}).to(dev);
    at::Tensor y1, y2;
    {
      tessera::Bf16Autocast ac;
      y1 = tessera::nn::linearAccumulateGrad(x, wMine, bMine);
      y2 = at::linear(x, wRef, bRef);
    }
    ASSERT_EQ(y1.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(y1, y2)) << "forward, micro-batch " << m;
    (y1.to(at::kFloat) * probe).sum().backward();
    (y2.to(at::kFloat) * probe).sum().backward();
    // Exact: the same bf16 operands the GEMMs saw, multiplied and summed in float64.
    auto xb = x.to(at::kBFloat16).to(at::kCPU, at::kDouble).reshape({-1, in});
    auto gb = probe.to(at::kBFloat16).to(at::kCPU, at::kDouble).reshape({-1, out});
    exactW += gb.t().mm(xb);
    exactB += gb.sum(0);
  }
  const double mine = maxRelErr(wMine.grad(), exactW), ref = maxRelErr(wRef.grad(), exactW);
  fmt::print("weight gradient after {} micro-batches, max error relative to the largest entry: fused {:.2e}, "
             "at::linear + autograd {:.2e}\n",
             micro, mine, ref);
  EXPECT_EQ(wMine.grad().scalar_type(), at::kFloat);
  EXPECT_LT(mine, 1e-4);       // fp32 sums of bf16 products
  EXPECT_LE(mine, ref + 1e-6);  // never worse than rounding each micro-batch's gradient to bf16
  EXPECT_LT(maxRelErr(bMine.grad(), exactB), 1e-4);
}

TEST(AccumLinearGpu, GradAccumulatorHooksStillFire) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  tessera::testing::checkHooksSeeAccumulatedGrads(at::Device(at::kCUDA, 0));
}

// nn::embeddingAccumulateGrad on CUDA: 4 micro-batches of ids with many repeats against
// at::embedding + autograd, the summed gradient within float32 rounding of the float64 sum, and
// bitwise the same in two runs (index_put_ with accumulate sorts by row on CUDA).
TEST(AccumEmbeddingGpu, MicroBatchesDeterministic) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  const int64_t vocab = 1000, dim = 96;
  torch::manual_seed(12);
  auto w0 = at::randn({vocab, dim});
  std::vector<at::Tensor> ids, probes;
  auto exact = at::zeros({vocab, dim}, at::kDouble);
  for (int m = 0; m < 4; ++m) {
    ids.push_back(at::randint(0, 40, {2, 512}, at::kLong));  // 1024 lookups over 40 rows
    probes.push_back(at::randn({2, 512, dim}));
    exact.index_put_({ids.back().reshape({-1})}, probes.back().reshape({-1, dim}).to(at::kDouble), true);
  }
  auto run = [&](bool fused) {
    auto w = w0.to(dev).requires_grad_(true);
    for (int m = 0; m < 4; ++m) {
      auto y = fused ? tessera::nn::embeddingAccumulateGrad(ids[m].to(dev), w) : at::embedding(w, ids[m].to(dev));
      (y * probes[m].to(dev)).sum().backward();
    }
    return w.grad().to(at::kCPU);
  };
  auto a = run(true), b = run(true), ref = run(false);
  EXPECT_TRUE(at::equal(a, b)) << "two runs differ";
  EXPECT_LT(maxRelErr(a, exact), 1e-5);
  EXPECT_LT(maxRelErr(ref, exact), 1e-5);
}

// Stale gradients (nn/stale_grads.h) on CUDA under bf16 autocast: a stale .grad full of NaN is
// overwritten by the weight GEMM (beta = 0) and the bias GEMM, bitwise what a fresh .grad gets,
// and the next micro-batch adds as usual.
TEST(AccumLinearGpu, StaleGradIsOverwrittenBitwiseAsFresh) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  torch::manual_seed(13);
  auto w0 = at::randn({192, 128}) * 0.05, b0 = at::randn({192}) * 0.05;
  auto wStale = w0.to(dev).requires_grad_(true), bStale = b0.to(dev).requires_grad_(true);
  auto wFresh = w0.to(dev).requires_grad_(true), bFresh = b0.to(dev).requires_grad_(true);
  wStale.mutable_grad() = at::full({192, 128}, std::numeric_limits<float>::quiet_NaN(), at::device(dev));
  bStale.mutable_grad() = at::full({192}, std::numeric_limits<float>::quiet_NaN(), at::device(dev));
  tessera::nn::markStale({wStale, bStale});
  for (int m = 0; m < 2; ++m) {
    auto x = at::randn({2, 64, 128}).to(dev);
    for (auto* p : {&wStale, &wFresh}) {
      tessera::Bf16Autocast ac;
      auto& b = p == &wStale ? bStale : bFresh;
      tessera::nn::linearAccumulateGrad(x, *p, b).to(at::kFloat).sum().backward();
    }
    EXPECT_TRUE(at::equal(wStale.grad(), wFresh.grad())) << "weight gradient after micro-batch " << m;
    EXPECT_TRUE(at::equal(bStale.grad(), bFresh.grad())) << "bias gradient after micro-batch " << m;
  }
  EXPECT_EQ(tessera::nn::staleCount(), 0u);
}
