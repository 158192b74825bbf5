// The multi-tensor AdamW kernel (kernels::multiTensorAdamW on CUDA tensors) on one GPU:
// - against the per-tensor CUDA kernel (kernels::adamwStep), bitwise: both run adamw_math.cuh's
//   update on each element (the per-tensor kernel is checked against the CPU reference, with its
//   rounding bound, in test_adamw_gpu.cpp), over 100 tensors of random sizes (0, 1, odd, several
//   65536-element chunks, up to 300k) in 3 launches, a random weight-decay mask, steps 1, 2 and
//   1000, and tensors at 4-byte offsets (not 16-byte aligned: the scalar path) beside aligned ones;
// - its bfloat16 copies equal the updated parameters rounded to bf16 (at::Tensor::to), bitwise;
// - against the CPU reference directly for one list, within the per-tensor test's bounds;
// - optim::AdamW with multiTensor on CUDA steps exactly as without (the trainer's switch).
// Skips visibly without a GPU or a CUDA LibTorch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

#include "comm/gpu/gpu_test_util.h"
#include "fused_check.h"
#include "kernels/adamw.h"
#include "kernels/multi_tensor_adamw.h"
#include "tessera/optim/adamw.h"

using namespace tessera;
using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

const at::Device kGpu(at::kCUDA, 0);

struct Lists {
  std::vector<at::Tensor> p, g, m, v;
  std::vector<bool> decay;
};

// n tensors on the GPU; every third one a view at a 1-element (4-byte) offset into a larger buffer.
Lists randomLists(int n, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> small(0, 3000), large(3000, 300000);
  std::uniform_int_distribution<int> pick(0, 9);
  Lists l;
  for (int i = 0; i < n; ++i) {
    const int64_t numel = pick(rng) < 3 ? large(rng) : small(rng);
    const bool offset = i % 3 == 0;
    auto make = [&](const at::Tensor& values) {
      if (!offset) return values.to(kGpu);
      auto buf = at::zeros({numel + 1}, at::TensorOptions().device(kGpu));
      auto view = buf.narrow(0, 1, numel);
      view.copy_(values);
      return view;
    };
    l.p.push_back(make(at::randn({numel})));
    l.g.push_back(make(spread({numel}, -7, 1)));
    l.m.push_back(make(spread({numel}, -8, 0)));
    l.v.push_back(make(spread({numel}, -14, 2).abs()));
    l.decay.push_back(pick(rng) < 6);
  }
  return l;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

}  // namespace

TEST(MultiTensorAdamWGpu, BitwiseThePerTensorKernel) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(41);
  std::mt19937 rng(41);
  auto a = randomLists(100, rng);
  auto p2 = clones(a.p), m2 = clones(a.m), v2 = clones(a.v);
  std::vector<at::Tensor> copies;
  for (const auto& p : a.p) copies.push_back(at::empty(p.sizes(), p.options().dtype(at::kBFloat16)));
  for (int64_t step : {1, 2, 1000}) {
    const AdamWStep s{3e-4, 0.9, 0.95, 1e-8, 0.1, step};
    multiTensorAdamW(a.p, a.g, a.m, a.v, a.decay, s, copies);
    for (size_t i = 0; i < a.p.size(); ++i) {
      auto si = s;
      if (!a.decay[i]) si.weightDecay = 0;
      adamwStep(p2[i], a.g[i], m2[i], v2[i], si);
    }
    for (size_t i = 0; i < a.p.size(); ++i) {
      const auto where = fmt::format("step {}, tensor {} ({} elements, offset {}, decay {})", step, i, a.p[i].numel(),
                                     i % 3 == 0, static_cast<bool>(a.decay[i]));
      EXPECT_TRUE(at::equal(a.p[i], p2[i])) << where << ": param";
      EXPECT_TRUE(at::equal(a.m[i], m2[i])) << where << ": exp_avg";
      EXPECT_TRUE(at::equal(a.v[i], v2[i])) << where << ": exp_avg_sq";
      EXPECT_TRUE(at::equal(copies[i], a.p[i].to(at::kBFloat16))) << where << ": bf16 copy";
    }
  }
}

// Clipping's coefficient read by the kernel (gradScale) gives bitwise the step on gradients scaled
// first by _foreach_mul_ (the old clipping pass), and leaves the gradients unwritten.
TEST(MultiTensorAdamWGpu, GradScaleBitwiseTheScaledGradients) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(43);
  std::mt19937 rng(43);
  auto a = randomLists(60, rng);
  auto p2 = clones(a.p), m2 = clones(a.m), v2 = clones(a.v), g0 = clones(a.g);
  const auto scale = at::full({1}, 0.2917f, a.p[0].options());
  for (int64_t step : {1, 5}) {
    const AdamWStep s{3e-4, 0.9, 0.95, 1e-8, 0.1, step};
    multiTensorAdamW(a.p, a.g, a.m, a.v, a.decay, s, {}, scale);
    auto g2 = clones(a.g);
    at::_foreach_mul_(g2, scale.reshape({}));
    multiTensorAdamW(p2, g2, m2, v2, a.decay, s);
    for (size_t i = 0; i < a.p.size(); ++i) {
      const auto where = fmt::format("step {}, tensor {} ({} elements)", step, i, a.p[i].numel());
      EXPECT_TRUE(at::equal(a.p[i], p2[i])) << where << ": param";
      EXPECT_TRUE(at::equal(a.m[i], m2[i])) << where << ": exp_avg";
      EXPECT_TRUE(at::equal(a.v[i], v2[i])) << where << ": exp_avg_sq";
      EXPECT_TRUE(at::equal(a.g[i], g0[i])) << where << ": the gradient was written";
    }
  }
}

TEST(MultiTensorAdamWGpu, WithinTheBoundsOfTheCpuReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(42);
  std::mt19937 rng(42);
  auto a = randomLists(12, rng);
  std::vector<at::Tensor> p, g, m, v, m0;
  for (size_t i = 0; i < a.p.size(); ++i) {
    p.push_back(a.p[i].cpu());
    g.push_back(a.g[i].cpu());
    m.push_back(a.m[i].cpu());
    v.push_back(a.v[i].cpu());
    m0.push_back(m.back().to(at::kDouble));
  }
  const AdamWStep s{1e-3, 0.9, 0.999, 1e-8, 1e-2, 3};
  multiTensorAdamW(a.p, a.g, a.m, a.v, a.decay, s);
  multiTensorAdamW(p, g, m, v, a.decay, s);
  // test_adamw_gpu.cpp's bounds: m 4u of its terms, v 8u, p 32u of the update's size U plus 2 ulps.
  const double beta1 = 0.9f, omb1 = 0.1f;
  const double sqrtBc2 = static_cast<float>(std::sqrt(1 - std::pow(0.999, 3.0)));
  const double stepSize = static_cast<float>(1e-3 / (1 - std::pow(0.9, 3.0)));
  for (size_t i = 0; i < p.size(); ++i) {
    auto termsM = (m0[i] * beta1).abs() + (g[i].to(at::kDouble) * omb1).abs();
    auto vNew = v[i].to(at::kDouble);
    auto update = termsM * stepSize / (vNew.sqrt() / sqrtBc2 + static_cast<float>(1e-8));
    const auto where = fmt::format("tensor {} ({} elements)", i, p[i].numel());
    expectWithin(a.m[i], m[i], termsM * (4 * kU32), where + " exp_avg");
    expectWithin(a.v[i], v[i], vNew * (8 * kU32), where + " exp_avg_sq");
    expectWithin(a.p[i], p[i], (update * 32 + p[i].to(at::kDouble).abs() * 4) * kU32, where + " param");
  }
}

TEST(MultiTensorAdamWGpu, OptimizerSwitchStepsAlike) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(43);
  std::vector<at::Tensor> p1, p2;
  for (int64_t n : {17, 4096, 70001, 3}) {
    auto t = at::randn({n}).to(kGpu);
    p1.push_back(t.clone().requires_grad_());
    p2.push_back(t.clone().requires_grad_());
  }
  const std::vector<std::string> names = {"blocks.0.w.weight", "blocks.0.ln1.weight", "head.weight", "x.bias"};
  std::vector<bool> decay;
  for (const auto& n : names) decay.push_back(optim::decaysByName(n, true));
  AdamWOptions o;
  o.weightDecay = 0.1;
  optim::AdamW multi(p1, names, decay, o, /*multiTensor=*/true), single(p2, names, decay, o, /*multiTensor=*/false);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < p1.size(); ++i) {
      auto g = at::randn(p1[i].sizes()).to(kGpu);
      p1[i].mutable_grad() = g.clone();
      p2[i].mutable_grad() = g.clone();
    }
    if (step == 2) {  // clipping's coefficient: read by the kernel, or scaled into .grad first
      const auto scale = at::full({1}, 0.61f, at::TensorOptions().device(kGpu));
      multi.step(scale);
      single.step(scale);
    } else {
      multi.step();
      single.step();
    }
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_TRUE(at::equal(p1[i], p2[i])) << "step " << step << " " << names[i];
      EXPECT_TRUE(at::equal(multi.expAvgSq()[i], single.expAvgSq()[i])) << "step " << step << " " << names[i];
    }
  }
}

TEST(MultiTensorAdamWGpu, MixedDevicesAreErrors) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto c = [] { return at::zeros({8}, at::TensorOptions().device(kGpu)); };
  EXPECT_NO_THROW(expectErrorContaining([&] { multiTensorAdamW({c()}, {at::zeros({8})}, {c()}, {c()}, {true}, {}); },
                                        {"multiTensorAdamW", "grads[0]", "cuda:0", "cpu"}));
  EXPECT_NO_THROW(expectErrorContaining(
      [&] { multiTensorAdamW({c()}, {c().to(at::kBFloat16)}, {c()}, {c()}, {true}, {}); },
      {"multiTensorAdamW", "grads[0]", "float32", "bfloat16"}));
}
