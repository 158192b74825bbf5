// common/attention.h on one GPU (LibTorch >= 2.5): grouped-query attention with the fused kernel
// reading the kv heads as they are (nativeGqa) against the same kernel on repeated copies, bf16:
// outputs and the gradients of q, k and v. Skips visibly without a GPU or a CUDA LibTorch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/attention.h"

TEST(AttentionGpu, NativeGqaMatchesRepeatedHeads) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  torch::manual_seed(10);
  auto make = [&](int64_t h) { return (at::randn({2, h, 256, 64}) * 0.5).to(dev, at::kBFloat16); };
  const auto q0 = make(32), k0 = make(8), v0 = make(8), probe = make(32);
  std::vector<at::Tensor> outs, grads;
  for (bool native : {true, false}) {
    auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
    auto y = tessera::causalSelfAttention(q, k, v, native);
    (y.to(at::kFloat) * probe.to(at::kFloat)).sum().backward();
    outs.push_back(y.to(at::kFloat));
    for (auto* t : {&q, &k, &v}) grads.push_back(t->grad().to(at::kFloat));
  }
  // Both are fused bf16 kernels (the repeated path's kv gradients summed over 4 copies in bf16).
  auto close = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item<double>();
  };
  EXPECT_LT(close(outs[0], outs[1]), 2e-2);
  for (int i = 0; i < 3; ++i) EXPECT_LT(close(grads[i], grads[3 + i]), 3e-2) << "gradient " << "qkv"[i];
}
