// train_gpt: a GPT trained with any dp × pp × tp layout (DDP or FSDP on the data axis).
// The same binary runs under every launcher tessera bootstraps from:
//   scripts/torchrun --nproc_per_node=4 build/examples/train_gpt --tp 2
//   mpirun -np 8 build/examples/train_gpt --pp 2 --tp 2 --dp-mode fsdp
//   srun --mpi=pmix -n 8 build/examples/train_gpt --pp 2 --tp 2 --config run.toml
// Flags: train_gpt --help (examples/gpt/options.h). Rank 0 prints the resolved config (a TOML
// file that --config reads back; also written into each checkpoint as config.toml), then each step
// (loss, tokens/s, MFU, step-time breakdown, peak memory) and writes the JSONL log (--log-jsonl).
// Exit status: 0 on success, 2 on bad flags, config files and layouts (UsageError), 1 on any
// other error (printed with the rank, and published to the other ranks: comm/watchdog/board.h);
// 3 when the watchdog ends a stuck rank.
#include <fmt/format.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "comm/bootstrap/init.h"
#include "common/error.h"
#include "common/log.h"
#include "gpt/options.h"
#include "gpt/trainer.h"

int main(int argc, char** argv) {
  namespace gpt = tessera::gpt;
  gpt::TrainOptions opts;
  tessera::InitOptions init;
  bool onGpu = false;
  try {
    init.settings = tessera::Settings::fromEnvironment();  // the one read of TESSERA_* (comm/settings.h)
    // GPU defaults where a GPU is visible and the backend is not forced to Gloo.
    onGpu = torch::cuda::is_available() &&
            init.settings->backend.value_or(tessera::Backend::Nccl) == tessera::Backend::Nccl;
    opts = gpt::parseOptions(argc, argv, onGpu, *init.settings);
    if (opts.model == "help") {
      std::cout << gpt::usage(onGpu, *init.settings);
      return 0;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  try {
    {
      auto ctx = tessera::init(init);
      gpt::resolveLayout(opts, ctx.world->size());
      if (ctx.world->rank() == 0) {
        std::string toml = gpt::configToml(opts);
        toml.pop_back();  // its last newline: the log adds one
        tessera::log::info("train_gpt: the resolved config (train_gpt --config FILE runs it again):\n{}", toml);
      }
      gpt::Trainer trainer(opts, ctx);
      trainer.run();
      ctx.world->barrier()->wait();
    }
    // Done: the trainer and the communicators are destroyed, files closed. Output flushed, the
    // process ends without LibTorch's static destructors, which unregister every operator (0.4 s
    // of CPU per rank, for nothing at exit).
    std::fflush(nullptr);
    std::_Exit(0);
  } catch (const gpt::UsageError& e) {  // every rank finds it alike: nothing to publish
    const int rank = tessera::log::rank();
    fmt::print(stderr, "train_gpt: {}error: {}\n", rank >= 0 ? fmt::format("rank {}: ", rank) : "", e.what());
    std::fflush(stderr);
    return 2;
  } catch (const std::exception& e) {
    // One write per line (the text and its newline together): the ranks share stderr, and
    // a line written in two pieces can be split by another rank's line. The rank once the
    // bootstrap knows it (before, init's message says what it knew).
    const int rank = tessera::log::rank();
    fmt::print(stderr, "train_gpt: {}error: {}\n", rank >= 0 ? fmt::format("rank {}: ", rank) : "", e.what());
    std::fflush(stderr);
    // The job's error board: the other ranks name this error as the cause (the store's host
    // waits a moment for them to read it). The communicators are gone by now, so the peers'
    // collectives fail at once rather than at their timeout.
    tessera::publishFatal(e);
    return 1;
  }
}
