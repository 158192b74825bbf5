// Where one GPU's training step goes: the benchmarks' GPT-735M (common/bench_model.h) trained as
// bench/ddp's single mode (bf16 autocast, fused AdamW, batch B), profiled with LibTorch's Kineto
// profiler over PROFILE_STEPS (2) steps after 3 warm-ups (tessera's StepProfiler,
// common/profiler.h); the Chrome trace goes to the path given. bench/profile/summarize.py turns it
// (and torch_profile.py's trace of PyTorch's own model) into a table of GPU kernels.
//   tessera_bench_profile TRACE.json
// Needs LibTorch 2.x with CUDA (the profiler's C++ API) and a GPU; a diagnostic, not a benchmark.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <iostream>
#include <string>
#include <tuple>

#include "bench_model.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/profiler.h"
#include "fused_adamw.h"
#include "timing.h"

namespace bench = tessera::bench;

int main(int argc, char** argv) try {
  TESSERA_CHECK(argc == 2, "usage: {} TRACE.json", argv[0]);
  const auto cfg = bench::modelFromEnv();
  const int64_t batch = bench::envInt("B", 8);
  const int steps = static_cast<int>(bench::envInt("PROFILE_STEPS", 2));
  const auto device = bench::singleProcessDevice();
  TESSERA_CHECK(device.is_cuda(), "profile_single: needs a GPU");
  bench::useDevice(device);
  const auto tp = bench::selfGroup(device);
  auto model = bench::buildModel(cfg, tp, tessera::models::ChunkRange::whole(cfg));
  model->to(device);
  bench::FusedAdamW opt(model->parameters());
  at::Tensor x, y;
  std::tie(x, y) = bench::randomBatch(cfg, batch, bench::kDataSeed, device);
  auto step = [&] {
    at::Tensor loss;
    {
      tessera::Bf16Autocast autocast(true);
      loss = tessera::models::lmLoss(model->forward(x), y, tp, cfg.vocab);
    }
    loss.backward();
    opt.step();
    opt.zeroGrad(/*setToNone=*/true);
  };
  auto times = bench::timeSteps(bench::kWarmSteps, 5, device, step, /*profileRank=*/-1);
  std::cout << "profile_single: step ms (unprofiled, median of 5) " << bench::median(times) * 1e3 << std::endl;

  // Steps 0..PROFILE_STEPS-1 of what follows, through tessera's StepProfiler (common/profiler.h).
  tessera::StepProfiler profiler(0, fmt::format("{}:0:{}", argv[1], steps));
  TESSERA_CHECK(profiler.enabled(), "profile_single: this build has no Kineto profiler");
  for (int i = 0; i < steps; ++i) {
    profiler.beginStep(i);
    step();
    bench::synchronize(device);
    profiler.endStep(i);
  }
  std::cout << "profile_single: " << steps << " steps traced to " << argv[1] << std::endl;
  return 0;
} catch (const std::exception& e) {
  std::cerr << "profile_single: error: " << e.what() << std::endl;
  return 1;
}
