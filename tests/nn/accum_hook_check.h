#pragma once
// Shared by the CPU and GPU tests of nn::linearAccumulateGrad: a post hook on the weight's and
// bias's gradient accumulators (as DDP's reducer and FSDP register them) must still fire once
// per backward, and at that moment .grad must already hold the accumulated sum (DDP reads it in
// that hook). The op returns no gradient to those nodes; this pins down that the autograd engine
// (LibTorch 1.13 on the CPU, 2.x on the GPU machine) still runs them and their hooks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <memory>
#include <vector>

#include "tessera/nn/accum_linear.h"

namespace tessera::testing {

inline void checkHooksSeeAccumulatedGrads(const at::Device& dev) {
  torch::manual_seed(5);
  auto w = at::randn({3, 4}).to(dev).requires_grad_(true);
  auto b = at::randn({3}).to(dev).requires_grad_(true);
  std::vector<double> seenW, seenB;
  auto hook = [](const at::Tensor& p, std::vector<double>& seen) {
    auto acc = torch::autograd::impl::grad_accumulator(p);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [p, &seen](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          seen.push_back(p.grad().defined() ? p.grad().sum().item<double>() : -12345.0);
          return outputs;
        }));
    return acc;  // keeps the accumulator (and its hook) alive
  };
  auto accW = hook(w, seenW), accB = hook(b, seenB);
  double wantW = 0, wantB = 0;
  for (int m = 0; m < 3; ++m) {
    auto x = at::randn({5, 4}).to(dev);
    nn::linearAccumulateGrad(x, w, b).sum().backward();
    // d/dW Σ (x Wᵀ + b) sums to 3 x Σx; d/db sums to 3 x 5.
    wantW += 3 * x.sum().item<double>();
    wantB += 15;
    ASSERT_EQ(seenW.size(), static_cast<size_t>(m + 1)) << "weight hook after micro-batch " << m;
    ASSERT_EQ(seenB.size(), static_cast<size_t>(m + 1)) << "bias hook after micro-batch " << m;
    EXPECT_NEAR(seenW.back(), wantW, 1e-3 * (1 + std::abs(wantW))) << "weight .grad seen by the hook, micro-batch " << m;
    EXPECT_NEAR(seenB.back(), wantB, 1e-3 * wantB) << "bias .grad seen by the hook, micro-batch " << m;
  }
}

}  // namespace tessera::testing
