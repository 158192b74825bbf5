// The optimizer phase alone (bench/single_gpu/run.sh): optim::AdamW over the parameters of
// train_gpt's model (the preset's pipeline chunk on one rank: its names, shapes and weight-decay
// mask, as train_gpt builds them) with fixed random gradients, the per-tensor kernels (one launch
// per tensor) against the multi-tensor kernel (a few launches), and train_gpt's whole phase
// (clipping's norm and coefficient, then the multi-tensor AdamW), each timed over STEPS steps after
// 5 warm-ups (device synchronised before and after: the mean of the steps between). Prints one
// RESULT line (bench/result_lines.py) per kernel. PyTorch's fused AdamW on the same shapes is
// single_gpu.py adamw.
//   torchrun --standalone --nproc_per_node=1 --no_python tessera_bench_adamw --model 735m|llama3-1b
#include <fmt/format.h>

#include <chrono>
#include <string>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/models/lm.h"
#include "tessera/optim/adamw.h"
#include "tessera/parallel/grad_norm.h"

using namespace tessera;

int main(int argc, char** argv) try {
  std::string model = "735m";
  for (int i = 1; i + 1 < argc; i += 2) {
    TESSERA_CHECK(std::string(argv[i]) == "--model", "tessera_bench_adamw: unknown argument '{}'", argv[i]);
    model = argv[i + 1];
  }
  const int steps = std::getenv("STEPS") ? std::atoi(std::getenv("STEPS")) : 20;
  auto ctx = init();
  TESSERA_CHECK(ctx.device.is_cuda(), "tessera_bench_adamw: needs a GPU");
  useDevice(ctx.device);
  const auto cfg = models::presetConfig(model);
  models::LmChunk chunk(cfg, ctx.world, nullptr, models::ChunkRange::whole(cfg), models::LayerOptions{});
  chunk->to(ctx.device);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<bool> decay;
  int64_t numel = 0;
  for (const auto& p : chunk->params()) {
    params.push_back(p.tensor);
    names.push_back(p.name);
    decay.push_back(optim::decaysByName(p.name, true));
    p.tensor.mutable_grad() = at::randn_like(p.tensor) * 1e-5;  // a norm below 1 (as single_gpu.py's)
    numel += p.tensor.numel();
  }
  std::vector<GradPiece> pieces;
  for (const auto& p : params) pieces.push_back({p.grad(), 1.0});
  // per-tensor, multi-tensor, and train_gpt's whole phase: the clipping norm and coefficient, the
  // multi-tensor AdamW scaling the gradients by it as it reads them.
  for (const char* kind : {"per-tensor", "multi-tensor", "clip+multi-tensor"}) {
    const bool multi = std::string(kind) != "per-tensor", clip = std::string(kind) == "clip+multi-tensor";
    AdamWOptions o;
    o.lr = 1e-4;
    o.weightDecay = 0.1;
    optim::AdamW adam(params, names, decay, o, multi);
    auto step = [&] {
      if (clip) {
        adam.step(globalGradNorm(pieces, {}, 1.0, ctx.device).coef);
      } else {
        adam.step();
      }
    };
    for (int i = 0; i < 5; ++i) step();
    synchronizeDevice(ctx.device);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    synchronizeDevice(ctx.device);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    fmt::print("RESULT {{\"system\": \"tessera-adamw-{}\", \"model\": \"{}\", \"tensors\": {}, \"params_M\": {:.1f}, "
               "\"step_ms\": {:.3f}}}\n",
               kind, model, params.size(), numel / 1e6, ms);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "tessera_bench_adamw: {}\n", e.what());
  return 1;
}
