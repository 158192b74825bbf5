// nn::addRmsNorm / nn::addLayerNorm (kernels/add_norm.h's references behind one autograd op) on
// the CPU against ATen's composite ops with autograd: s = x + branch and y = norm(s), and the
// gradients of x, branch, weight and bias when both s and y feed the loss (as in a block: s goes
// on along the residual path), float32, odd sizes; without a branch (s is x); a float32 stream
// with a bfloat16 branch (the autocast case: s float32, the branch's gradient bfloat16); s unused.
// Tolerance as test_fused_ops.cpp: |Δ| <= 1e-5·|want| + 1e-6·max|want| (float32 maths in another
// order). And bitwise: the op's CPU path equals the separate add and nn::layerNorm / nn::rmsNorm
// (the models' CPU runs with fused kernels must not move by the fusion).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>

#include "fused_check.h"
#include "harness/multiprocess.h"
#include "tessera/nn/fused_norm.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

void close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  expectCloseToAten(got, want, what);
}

using Fn = std::function<nn::AddNormResult(const std::vector<at::Tensor>&)>;

// inputs: x, branch (undefined: none), weight (, bias). Runs both, backward of Σ s·gs + Σ y·gy.
// compare(got, want, what) is called on s, y and every defined input's gradient.
template <typename Compare>
void run(const std::vector<at::Tensor>& inputs, const Fn& a, const Fn& b, const std::string& what, Compare compare,
         bool useS = true) {
  std::vector<at::Tensor> ia, ib;
  for (const auto& t : inputs) {
    ia.push_back(t.defined() ? t.detach().clone().requires_grad_() : t);
    ib.push_back(t.defined() ? t.detach().clone().requires_grad_() : t);
  }
  auto ra = a(ia), rb = b(ib);
  ASSERT_EQ(ra.s.scalar_type(), rb.s.scalar_type()) << what;
  ASSERT_EQ(ra.y.scalar_type(), rb.y.scalar_type()) << what;
  compare(ra.s, rb.s, what + ": s");
  compare(ra.y, rb.y, what + ": y");
  auto gs = at::randn(rb.s.sizes()).to(rb.s.scalar_type()), gy = at::randn(rb.y.sizes()).to(rb.y.scalar_type());
  auto loss = [&](const nn::AddNormResult& r) { return (useS ? (r.s * gs).sum() : at::zeros({})) + (r.y * gy).sum(); };
  loss(ra).backward();
  loss(rb).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    ASSERT_TRUE(ia[i].grad().defined()) << what << ": no gradient for input " << i;
    EXPECT_EQ(ia[i].grad().scalar_type(), ib[i].grad().scalar_type()) << what << ": gradient dtype of input " << i;
    compare(ia[i].grad(), ib[i].grad(), fmt::format("{}: gradient of input {}", what, i));
  }
}

void bitwise(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(at::equal(got, want)) << what << ": not bitwise equal, max |diff| "
                                    << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor rmsComposite(const at::Tensor& s, const at::Tensor& w, double eps) {
  return s * at::rsqrt(s.pow(2).mean(-1, true) + eps) * w;
}

const std::vector<std::vector<int64_t>> kShapes = {{7, 33}, {3, 5, 64}, {2, 3, 3}, {4, 2, 48}, {1, 1, 2050}};

at::Tensor plus(const at::Tensor& x, const at::Tensor& branch) { return branch.defined() ? x + branch : x; }

TEST(FusedAddNorm, RmsMatchesCompositeWithAndWithoutBranch) {
  at::manual_seed(11);
  for (const auto& shape : kShapes) {
    const int64_t d = shape.back();
    for (bool withBranch : {true, false}) {
      const auto what = fmt::format("addRmsNorm {}{}", c10::str(shape), withBranch ? "" : " without branch");
      run({at::randn(shape) * 3, withBranch ? at::randn(shape) : at::Tensor(), at::randn({d}) + 1},
          [](const std::vector<at::Tensor>& t) { return nn::addRmsNorm(t[0], t[1], t[2], 1e-5); },
          [](const std::vector<at::Tensor>& t) {
            auto s = plus(t[0], t[1]);
            return nn::AddNormResult{s, rmsComposite(s, t[2], 1e-5)};
          },
          what, close);
    }
  }
}

TEST(FusedAddNorm, LayerMatchesCompositeWithAndWithoutBranchAndBias) {
  at::manual_seed(12);
  for (const auto& shape : kShapes) {
    const int64_t d = shape.back();
    for (bool withBranch : {true, false}) {
      for (bool withBias : {true, false}) {
        const auto what = fmt::format("addLayerNorm {}{}{}", c10::str(shape), withBranch ? "" : " without branch",
                                      withBias ? "" : " without bias");
        run({at::randn(shape) * 2 + 0.5, withBranch ? at::randn(shape) : at::Tensor(), at::randn({d}) + 1,
             withBias ? at::randn({d}) : at::Tensor()},
            [](const std::vector<at::Tensor>& t) { return nn::addLayerNorm(t[0], t[1], t[2], t[3], 1e-5); },
            [d](const std::vector<at::Tensor>& t) {
              auto s = plus(t[0], t[1]);
              return nn::AddNormResult{s, at::layer_norm(s, {d}, t[2], t[3], 1e-5)};
            },
            what, close);
      }
    }
  }
}

// The models' CPU path with fused kernels: the fused op against the separate add and the
// single-op norm it replaces, bitwise (values and gradients).
TEST(FusedAddNorm, CpuPathIsBitwiseTheSeparateAddAndNorm) {
  at::manual_seed(13);
  for (const auto& shape : kShapes) {
    const int64_t d = shape.back();
    for (bool withBranch : {true, false}) {
      const auto where = fmt::format("{}{}", c10::str(shape), withBranch ? "" : " without branch");
      auto branch = withBranch ? at::randn(shape) : at::Tensor();
      run({at::randn(shape) * 2 + 0.5, branch, at::randn({d}) + 1, at::randn({d})},
          [](const std::vector<at::Tensor>& t) { return nn::addLayerNorm(t[0], t[1], t[2], t[3], 1e-5); },
          [](const std::vector<at::Tensor>& t) {
            auto s = plus(t[0], t[1]);
            return nn::AddNormResult{s, nn::layerNorm(s, t[2], t[3], 1e-5)};
          },
          "addLayerNorm " + where, bitwise);
      run({at::randn(shape) * 3, branch, at::randn({d}) + 1},
          [](const std::vector<at::Tensor>& t) { return nn::addRmsNorm(t[0], t[1], t[2], 1e-6); },
          [](const std::vector<at::Tensor>& t) {
            auto s = plus(t[0], t[1]);
            return nn::AddNormResult{s, nn::rmsNorm(s, t[2], 1e-6)};
          },
          "addRmsNorm " + where, bitwise);
    }
  }
}

// A float32 stream and a bfloat16 branch (a GEMM's output under autocast): s is float32, the
// branch's gradient comes back in bfloat16 (both sides round the same float32 sum once).
TEST(FusedAddNorm, Bf16BranchOfFloatStream) {
  at::manual_seed(14);
  const std::vector<int64_t> shape{5, 3, 40};
  run({at::randn(shape), at::randn(shape).to(at::kBFloat16), at::randn({40}) + 1, at::randn({40})},
      [](const std::vector<at::Tensor>& t) { return nn::addLayerNorm(t[0], t[1], t[2], t[3], 1e-5); },
      [](const std::vector<at::Tensor>& t) {
        auto s = t[0] + t[1];
        return nn::AddNormResult{s, at::layer_norm(s, {40}, t[2], t[3], 1e-5)};
      },
      "addLayerNorm float32 + bfloat16", [](const at::Tensor& got, const at::Tensor& want, const std::string& what) {
        if (want.scalar_type() == at::kBFloat16) {
          // The gradients differ in float32 rounding before the one bf16 rounding: one bf16 ulp.
          expectWithin(got, want, bf16Ulp(want.to(at::kDouble)) * 1.01 + 1e-30, what);
        } else {
          close(got, want, what);
        }
      });
}

TEST(FusedAddNorm, OnlyTheNormUsed) {
  at::manual_seed(15);
  run({at::randn({6, 24}), at::randn({6, 24}), at::randn({24}) + 1},
      [](const std::vector<at::Tensor>& t) { return nn::addRmsNorm(t[0], t[1], t[2], 1e-5); },
      [](const std::vector<at::Tensor>& t) {
        auto s = t[0] + t[1];
        return nn::AddNormResult{s, rmsComposite(s, t[2], 1e-5)};
      },
      "addRmsNorm, s unused", close, /*useS=*/false);
}

TEST(FusedAddNorm, BadInputsAreErrors) {
  EXPECT_NO_THROW(expectErrorContaining(
      [] { nn::addLayerNorm(at::randn({4, 8}), at::randn({4, 7}), at::ones({8}), {}, 1e-5); },
      {"addLayerNormForward", "branch", "[4, 7]"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [] { nn::addRmsNorm(at::randn({4, 8}), at::randn({4, 8}).to(at::kDouble), at::ones({8}), 1e-5); },
      {"addRmsNormForward", "branch", "float64"}));
  EXPECT_NO_THROW(expectErrorContaining([] { nn::addRmsNorm(at::randn({4, 8}), {}, at::ones({6}), 1e-5); },
                                        {"addRmsNormForward", "weight", "[6]"}));
}

}  // namespace
