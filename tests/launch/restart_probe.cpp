// restart_probe: a small DDP training loop that checkpoints every step and resumes from its
// checkpoint, for the restart test under `torchrun --max-restarts` (tests/launch/launch_test.sh,
// case torchrun_restart).
//
//   restart_probe <checkpoint dir> <steps>
// TESSERA_CRASH_AT_STEP=k: rank 1 of the first attempt (TORCHELASTIC_RESTART_COUNT=0) exits 1
// right after saving step k, so torchrun restarts every worker, which resume at step k.
// Rank 0 prints "RESTART_PROBE attempt=<n> resumed_from=<step>" at start and, at the end,
// "RESTART_PROBE final <parameters as hex floats>" (bitwise comparable across runs). The batch of
// step s on rank r is a function of (s, r) only, so a resumed run must equal an uninterrupted one.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <filesystem>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/bootstrap/init.h"
#include "common/env.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: restart_probe <checkpoint dir> <steps>\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t steps = std::stoll(argv[2]);
  try {
    auto ctx = tessera::init();
    const int rank = ctx.world->rank();
    const int64_t attempt = tessera::env::getInt("TORCHELASTIC_RESTART_COUNT").value_or(0);
    torch::manual_seed(0);
    torch::nn::Linear model(8, 4);
    tessera::DistributedDataParallel::Named params;
    for (auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
    tessera::DistributedDataParallel ddp(params, {}, ctx.world);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));

    std::vector<tessera::checkpoint::Piece> state;
    for (auto& [name, p] : params) state.push_back(tessera::checkpoint::whole(name, p));
    int64_t start = 0;
    if (std::filesystem::exists(std::filesystem::path(dir) / "metadata.pt")) {
      start = tessera::checkpoint::load(dir, state).step;
    }
    if (rank == 0) std::printf("RESTART_PROBE attempt=%lld resumed_from=%lld\n", (long long)attempt, (long long)start);
    const auto crashAt = tessera::env::getInt("TESSERA_CRASH_AT_STEP");
    for (int64_t s = start; s < steps; ++s) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * s + rank);
      auto x = at::randn({4, 8}, gen), y = at::randn({4, 4}, gen);
      opt.zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      opt.step();
      tessera::checkpoint::save(dir, state, *ctx.world, s + 1);
      if (crashAt && *crashAt == s + 1 && rank == 1 && attempt == 0) {
        std::fprintf(stderr, "RESTART_PROBE rank 1 crashing on purpose after step %lld\n", (long long)(s + 1));
        std::fflush(nullptr);
        std::_Exit(1);
      }
    }
    if (rank == 0) {
      std::string out;
      for (auto& [name, p] : params) {
        auto c = p.detach().contiguous();
        for (int64_t i = 0; i < c.numel(); ++i) out += fmt::format(" {:a}", c.data_ptr<float>()[i]);
      }
      std::printf("RESTART_PROBE final%s\n", out.c_str());
    }
    std::fflush(nullptr);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "RESTART_PROBE FAILED: %s\n", e.what());
    return 1;
  }
}
