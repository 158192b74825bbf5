// The fused AdamW CUDA kernel (kernels::adamwStep on CUDA tensors, adamw_cuda.cu) against the
// CPU reference adamwStepReference (torch::optim::AdamW's ops, bitwise; test_fsdp_local) on one
// GPU: random fp32 parameters, states and gradients (magnitudes 1e-7..10, some exact zeros),
// sizes 1, 255, 257 (not multiples of the kernel's 256-thread block), 4099 and 3,000,017 (more
// elements than the grid covers at once on any current GPU: the grid is capped at 8 blocks of 256
// per SM, 270,336 elements on a 132-SM H100, so each thread loops), steps 1-4 and 1000 (bias
// corrections of different weight), three option sets: FSDP's defaults (ShardedAdamW: lr 1e-3,
// betas 0.9/0.999, eps 1e-8, weight decay 1e-2), the README's (lr 3e-4, weight decay 0.1,
// betas 0.9/0.95) and no weight decay (the reference skips the multiply; the kernel multiplies
// by exactly 1). The kernel takes fp32 tensors only: a bf16 gradient (or a CPU one) must be a
// clear error. Skips visibly without a GPU or a CUDA LibTorch.
//
// Each step starts GPU and CPU from the same state (the reference's), so the comparison is of
// one step and nothing accumulates across steps. Tolerance: both sides compute every output
// from the same inputs with a few roundings (unit roundoff u = 2^-24), but associated
// differently: the kernel rounds each op separately ((g·g)·(1−β2), −stepSize·(m/denom)), while
// ATen's CPU kernels fuse a·x+y into one FMA where vectorised (add_ with alpha), compute
// value·t1·t2 and value·t1/t2 left to right, and may contract further. So an output may differ
// by a few roundings of the largest term it is summed from (in double, from the step's inputs):
//   m: |Δm| <= 4u · (|β1·m| + |(1−β1)·g|)     (terms of either sign: bounded by their magnitudes)
//   v: |Δv| <= 8u · v'                        (non-negative terms; v' the reference's result)
//   p: |Δp| <= 32u · U + 4u·|p'|,  U = stepSize · (|β1·m| + |(1−β1)·g|) / (sqrt(v')/sqrt(bc2) + eps)
// U bounds the update's size; its relative error collects m's, denom's (v's halved by the sqrt,
// then a division and an addition, each side) and the update's own 2 roundings each side:
// ~22u at worst, 32u leaves margin. The final addition rounds on each side, together up to one
// ulp of p' (<= 2u·|p'|), and wherever the update is tiny beside p that ulp is the whole
// difference: 4u·|p'| allows 2 ulps. A wrong bias correction, a missed weight decay or a dropped
// write-back is off by a relative 1e-3 or more (thousands of times these bounds). The fraction of
// each bound used is printed; the kernel's math emulated on the CPU (float ops, no contraction,
// against this reference) used 0.50 of each (p: 1 ulp where the update is tiny; the update part
// alone <= 5.7u·U).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "tessera/comm/backends.h"
#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/error.h"
#include "kernels/adamw.h"

using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

// Largest |got - want| / allowed over the elements (the fraction of the bound used; 0 where
// equal, inf where nothing is allowed and they differ); adds a failure naming the worst element
// when it is over 1.
double checkWithin(const at::Tensor& got, const at::Tensor& want, const at::Tensor& allowed, const char* what,
                   const std::string& where) {
  auto d = (got.cpu().to(at::kDouble) - want.to(at::kDouble)).abs();
  auto r = at::where(d == 0, at::zeros_like(d), d / allowed);
  const double worst = d.numel() == 0 ? 0 : r.max().item<double>();
  if (!(worst <= 1)) {
    const int64_t i = r.argmax().item<int64_t>();
    ADD_FAILURE() << where << ": " << what << "[" << i << "] = " << got.cpu()[i].item<float>() << ", reference "
                  << want[i].item<float>() << ": off by " << d[i].item<double>() << ", " << worst
                  << " times the allowed " << allowed[i].item<double>();
  }
  return worst;
}

// Random values whose magnitudes spread over 10^lo..10^hi, about 1 in 20 exactly zero.
at::Tensor spread(int64_t n, double lo, double hi, bool positive = false) {
  auto mag = at::pow(10.0, at::rand({n}, at::kDouble) * (hi - lo) + lo);
  auto sign = positive ? at::ones({n}, at::kDouble) : at::sign(at::randn({n}, at::kDouble));
  auto keep = (at::rand({n}) >= 0.05).to(at::kDouble);
  return (mag * sign * keep).to(at::kFloat);
}

struct Worst {
  double p = 0, m = 0, v = 0;
};

// One step on `dev` from the CPU state (p, m, v) with gradient g, against the reference applied
// to (p, m, v) in place.
void stepAndCompare(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const AdamWStep& s,
                    const at::Device& dev, const std::string& where, Worst& worst) {
  auto pd = p.to(dev), gd = g.to(dev), md = m.to(dev), vd = v.to(dev);
  auto m0 = m.to(at::kDouble);
  adamwStepReference(p, g, m, v, s);
  adamwStep(pd, gd, md, vd, s);

  const double beta1 = static_cast<float>(s.beta1), omb1 = static_cast<float>(1 - s.beta1);
  const double sqrtBc2 = static_cast<float>(std::sqrt(1 - std::pow(s.beta2, static_cast<double>(s.step))));
  const double stepSize = static_cast<float>(s.lr / (1 - std::pow(s.beta1, static_cast<double>(s.step))));
  auto termsM = (m0 * beta1).abs() + (g.to(at::kDouble) * omb1).abs();
  auto vNew = v.to(at::kDouble);
  auto update = termsM * stepSize / (vNew.sqrt() / sqrtBc2 + static_cast<float>(s.eps));
  worst.m = std::max(worst.m, checkWithin(md, m, termsM * (4 * kU), "exp_avg", where));
  worst.v = std::max(worst.v, checkWithin(vd, v, vNew * (8 * kU), "exp_avg_sq", where));
  worst.p = std::max(worst.p, checkWithin(pd, p, (update * 32 + p.to(at::kDouble).abs() * 4) * kU, "param", where));
}

void runCases(const at::Device& dev, const std::vector<int64_t>& sizes) {
  const std::pair<const char*, AdamWStep> options[] = {
      {"fsdp defaults", {1e-3, 0.9, 0.999, 1e-8, 1e-2, 1}},
      {"lr 3e-4 wd 0.1 betas 0.9/0.95", {3e-4, 0.9, 0.95, 1e-8, 0.1, 1}},
      {"no weight decay", {1e-2, 0.8, 0.95, 1e-6, 0.0, 1}},
  };
  Worst worst;
  for (int64_t n : sizes) {
    for (const auto& [label, opt] : options) {
      auto p = at::randn({n});
      auto m = at::zeros({n}), v = at::zeros({n});
      for (int64_t step : {1, 2, 3, 4, 1000}) {
        AdamWStep s = opt;
        s.step = step;
        if (step == 1000) {  // a late step: states of a long run (v of the gradients' squares)
          m = spread(n, -8, 0);
          v = spread(n, -14, 2, /*positive=*/true);
        }
        const auto where = fmt::format("{} elements on {}, {}, step {}", n, dev.str(), label, step);
        stepAndCompare(p, spread(n, -7, 1), m, v, s, dev, where, worst);
      }
    }
  }
  fmt::print("{}: largest difference from the CPU reference, as a fraction of its bound: param {:.3g}, exp_avg {:.3g}, "
             "exp_avg_sq {:.3g}\n",
             dev.str(), worst.p, worst.m, worst.v);
}

}  // namespace

TEST(AdamWGpu, FusedKernelMatchesCpuReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  at::manual_seed(21);
  runCases(at::Device(at::kCUDA, 0), {1, 255, 257, 4099, 3000017});
}

// The launcher makes the tensors' device current for the launch: tensors on cuda:1 while
// cuda:0 is current (needs 2 GPUs; skipped visibly otherwise).
TEST(AdamWGpu, TensorsOnAnotherDeviceThanTheCurrentOne) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  TESSERA_REQUIRE_GPUS(2);
  at::manual_seed(22);
  runCases(at::Device(at::kCUDA, 1), {4099});
}

TEST(AdamWGpu, EmptyTensorsAreANoOp) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto e = at::empty({0}, at::TensorOptions().device(at::kCUDA, 0));
  EXPECT_NO_THROW(adamwStep(e, e.clone(), e.clone(), e.clone(), {}));
}

TEST(AdamWGpu, OtherDtypesAndDevicesAreClearErrors) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  auto p = at::zeros({10}, cuda), m = at::zeros({10}, cuda), v = at::zeros({10}, cuda);
  EXPECT_NO_THROW(expectErrorContaining([&] { adamwStep(p, at::zeros({10}, cuda.dtype(at::kBFloat16)), m, v, {}); },
                                        {"adamwStep", "grad must be a contiguous float32 tensor", "bfloat16"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { adamwStep(p, at::zeros({10}), m, v, {}); },
                                        {"adamwStep", "grad must be", "on cuda:0", "on cpu"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { adamwStep(p, at::zeros({20}, cuda).slice(0, 0, 20, 2), m, v, {}); },
                                        {"adamwStep", "grad must be a contiguous"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { adamwStep(p, p.clone(), m, v, {.step = 0}); },
                                        {"adamwStep", "step 0 must be >= 1"}));
}
