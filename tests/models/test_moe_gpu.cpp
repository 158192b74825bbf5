// The MoE experts' grouped GEMMs (src/models/moe/grouped.h) against the per-expert loop on one GPU:
// - runExperts both ways on the same inputs, under CUDA autocast to bf16 with float32 weights (the
//   trainer's DDP case) and with bf16 weights and no autocast (FSDP's gathered weights): the output
//   and the gradients of x, w1, w3, w2, for uneven counts with experts of no tokens, every row on
//   one expert, and equal counts; an empty expert's weight gradients are exactly zero;
// - the grouped path synchronizes the host with the device nowhere, forward or backward (SyncCheck);
// - shapes the kernel cannot take (d not a multiple of 8) fall back to the loop under Auto;
// - the whole MoE layer with TESSERA_MOE_GROUPED_GEMM=0 and unset: the same outputs and gradients,
//   and no host sync in its grouped forward and backward (one ep rank, dropless).
// FP8 forwards and the timings: test_moe_fp8_gpu.cpp; the shared helpers and tolerance: moe_gpu_util.h.
// Skips visibly without a GPU, a CUDA LibTorch or compute 9.0+.
#include <cstdlib>

#include "models/moe_gpu_util.h"
#include "tessera/models/moe.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::moe_gpu_test;

TEST(MoeGroupedGemmGpu, MatchesTheLoopForwardAndBackward) {
  REQUIRE_GROUPED();
  const std::vector<std::vector<int64_t>> cases = {
      {100, 0, 37, 250, 1, 64, 0, 20}, {0, 0, 0, 472, 0, 0, 0, 0}, {64, 64, 64, 64, 64, 64, 64, 64}};
  for (bool autocast : {true, false}) {  // float32 weights under autocast; bf16 weights without
    for (const auto& counts : cases) {
      const auto in = inputs(counts, 256, 128, autocast ? at::kFloat : at::kBFloat16);
      const auto loop = run(in, ExpertGemm::Loop, autocast), grouped = run(in, ExpertGemm::Grouped, autocast);
      const auto tag = fmt::format("autocast {} counts [{}]", autocast, fmt::join(counts, ", "));
      expectClose(grouped.y, loop.y, tag + " y");
      expectClose(grouped.x, loop.x, tag + " x.grad");
      expectClose(grouped.w1, loop.w1, tag + " w1.grad");
      expectClose(grouped.w3, loop.w3, tag + " w3.grad");
      expectClose(grouped.w2, loop.w2, tag + " w2.grad");
      for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] != 0) continue;
        for (const auto* w : {&grouped.w1, &grouped.w3, &grouped.w2}) {
          EXPECT_TRUE((*w)[static_cast<int64_t>(e)].eq(0).all().item<bool>()) << tag << ": expert " << e;
        }
      }
    }
  }
}

TEST(MoeGroupedGemmGpu, NoHostSynchronization) {
  REQUIRE_GROUPED();
  const auto in = inputs({100, 0, 37, 250, 1, 64, 0, 20}, 256, 128, at::kFloat);
  run(in, ExpertGemm::Grouped,
      true);  // warm-up: kernels loaded, autocast and allocator caches
  EXPECT_NO_THROW(run(in, ExpertGemm::Grouped, true, /*checkSync=*/true));
}

TEST(MoeGroupedGemmGpu, ShapesTheKernelCannotTakeFallBackToTheLoop) {
  REQUIRE_GROUPED();
  const auto in = inputs({5, 0, 7}, 60, 32, at::kFloat);  // d 60: rows of 120 bytes
  const auto loop = run(in, ExpertGemm::Loop, true), autoWay = run(in, ExpertGemm::Auto, true);
  EXPECT_TRUE(autoWay.y.equal(loop.y));
  EXPECT_THROW(run(in, ExpertGemm::Grouped, true), Error);
}

TEST(MoeGroupedGemmGpu, TheLayerWithAndWithoutGroupedGemms) {
  REQUIRE_GROUPED();
  auto c = presetConfig("moe-tiny");
  c.d = 128, c.moe.expertFfn = 64, c.moe.topK = 2, c.moe.auxLossCoef = 0.01;
  Moe m(c, 1, MoeOptions{});
  m->to(at::Device(at::kCUDA, 0));
  at::manual_seed(3);
  auto x0 = at::randn({4, 96, c.d}, at::kCUDA);
  auto pass = [&](bool checkSync) {
    auto x = x0.clone().requires_grad_();
    at::Tensor y;
    {
      std::unique_ptr<SyncCheck> check;  // grouped, one ep rank, dropless: no host sync, forward or backward
      if (checkSync) check = std::make_unique<SyncCheck>(x0.device(), SyncDebug::Error);
      {
        Bf16Autocast cast(true);
        y = m->forward(x);
      }
      y.to(at::kFloat).square().sum().backward();
    }
    std::vector<at::Tensor> out{y.detach().to(at::kFloat), x.grad()};
    for (auto& p : m->params("")) {
      out.push_back(p.tensor.grad().clone());
      p.tensor.mutable_grad().reset();
    }
    return out;
  };
  ::setenv("TESSERA_MOE_GROUPED_GEMM", "0", 1);
  const auto loop = pass(false);
  ::unsetenv("TESSERA_MOE_GROUPED_GEMM");
  pass(false);  // warm-up: autocast and allocator caches
  for (const auto& p : m->params("")) p.tensor.mutable_grad().reset();
  std::vector<at::Tensor> grouped;
  EXPECT_NO_THROW(grouped = pass(true));
  ASSERT_EQ(grouped.size(), loop.size());
  for (size_t i = 0; i < loop.size(); ++i) expectClose(grouped[i], loop[i], fmt::format("layer tensor {}", i));
}
