// train_gpt: a GPT or Llama trained in any dp × pp × cp × tp layout, with DDP or FSDP on the data
// axis: a command line over tessera::train (src/train). The same binary runs under every launcher
// tessera bootstraps from:
//   scripts/torchrun --nproc_per_node=4 build/bin/train_gpt --tp 2
//   mpirun -np 8 build/bin/train_gpt --pp 2 --tp 2 --dp-mode fsdp
//   srun --mpi=pmix -n 8 build/bin/train_gpt --pp 2 --tp 2 --config run.toml
//   build/bin/train_gpt --steps 10            (no launcher: one rank, alone)
// Flags: train_gpt --help. Rank 0 prints the resolved config (a TOML file that --config reads back;
// also written into each checkpoint as config.toml; --print-config prints it alone and exits), then
// a line per step and a summary, and writes the JSONL log.
// Exit status: 0 on success, 2 on bad flags, config files and layouts (UsageError), 1 on any other
// error (printed with the rank, and published to the other ranks: comm/watchdog/board.h); 3 when
// the watchdog ends a stuck rank.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/train/auto_layout.h"
#include "tessera/train/config.h"
#include "tessera/train/trainer.h"
#include "standalone.h"

namespace {

// One write per line (the text and its newline together): the ranks share stderr, and a line
// written in two pieces can be split by another rank's line. The rank once the bootstrap knows it.
void printError(const std::exception& e) {
  const int rank = tessera::log::rank();
  fmt::print(stderr, "train_gpt: {}error: {}\n", rank >= 0 ? fmt::format("rank {}: ", rank) : "", e.what());
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  namespace train = tessera::train;
  train::Config cfg;
  tessera::InitOptions init;
  try {
    init.settings = tessera::Settings::fromEnvironment();  // the one read of TESSERA_* (comm/settings.h)
    const auto machine = train::Machine::detect(*init.settings);  // GPU defaults where one is visible
    cfg = train::Config::parse(argc, argv, machine);
    if (cfg.help) {
      std::cout << train::usage(machine);
      return 0;
    }
    if (cfg.printConfig) {  // a dry run: the config resolved for the launcher's world, nothing started
      const char* world = std::getenv("WORLD_SIZE");
      const char* rank = std::getenv("RANK");
      cfg.resolve(world ? std::atoi(world) : 1);
      if (!rank || std::atoi(rank) == 0) std::cout << cfg.toToml();
      return 0;
    }
    if (cfg.timeoutS > 0) init.timeout = std::chrono::seconds(cfg.timeoutS);
    tessera::apps::aloneUnlessLaunched(init);  // `train_gpt --steps 10` alone: one rank
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  try {
    {
      auto ctx = tessera::init(init);
      if (cfg.parallel.autoLayout) train::chooseLayout(cfg, ctx);
      cfg.resolve(ctx.world->size());
      if (ctx.world->rank() == 0) {
        std::string toml = cfg.toToml();
        toml.pop_back();  // its last newline: the log adds one
        tessera::log::info("train_gpt: the resolved config (train_gpt --config FILE runs it again):\n{}", toml);
      }
      train::Trainer trainer(cfg, ctx);
      trainer.fit();
      ctx.world->barrier()->wait();
    }
    // Done: the trainer and the communicators are destroyed, files closed. Output flushed, the
    // process ends without LibTorch's static destructors, which unregister every operator (0.4 s
    // of CPU per rank, for nothing at exit).
    std::fflush(nullptr);
    std::_Exit(0);
  } catch (const train::UsageError& e) {  // every rank finds it alike: nothing to publish
    printError(e);
    return 2;
  } catch (const std::exception& e) {
    printError(e);
    // The job's error board: the other ranks name this error as the cause (the store's host
    // waits a moment for them to read it). The communicators are gone by now, so the peers'
    // collectives fail at once rather than at their timeout.
    tessera::publishFatal(e);
    return 1;
  }
}
