// tessera_generate: continues prompts (token ids) with a model from a checkpoint, greedy or
// sampled, with a key/value cache (src/models/generate.h). One process, or tp ranks under a
// launcher tessera bootstraps from (pp 1: every rank holds its tp shard of the whole model):
//   tessera_generate CKPT --prompt-ids 505,429,621 --max-new-tokens 30
//   torchrun --no_python -r 1 -t 1 --nproc_per_node 2 tessera_generate CKPT --prompt-ids 505,429 --tp 2
// Rank 0 prints one line "ids: a,b,c" per prompt on stdout (logs go to stderr).
// tools/tessera-generate is the front end that encodes text prompts and decodes the ids.
// Exit status: 0 on success, 1 on an error (printed with the rank), 2 on bad flags.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "generate/options.h"
#include "standalone.h"
#include "tessera/hf/safetensors.h"
#include "tessera/hf/model_source.h"

int main(int argc, char** argv) {
  using namespace tessera;
  generate::GenerateCli cli;
  InitOptions init;
  try {
    init.settings = Settings::fromEnvironment();  // the one read of TESSERA_* (comm/settings.h)
    cli = generate::parseCli(argc, argv);
    if (cli.help) {
      std::cout << generate::usage();
      return 0;
    }
    apps::aloneUnlessLaunched(init);  // else it runs alone, as rank 0 of 1
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  int rank = -1;
  try {
    {
      auto ctx = tessera::init(init);
      rank = ctx.world->rank();
      const int world = ctx.world->size();
      const int tp = cli.tp > 0 ? cli.tp : world;
      TESSERA_CHECK(tp == world,
                    "tessera_generate: --tp {} on a world of {} ranks: tp must be the world size (pp 1, no data "
                    "parallel)",
                    tp, world);
      const auto source = hf::openModel(cli.modelDir, cli.model);
      if (rank == 0) {
        log::info("tessera_generate: {}; {}; tp {} on {}", source.describe, source.config.describe(), tp,
                  ctx.deviceDescription);
      }
      auto model = hf::loadWholeModel(source, ctx.world, ctx.device);
      hf::NamedTensors logits;
      for (size_t k = 0; k < cli.prompts.size(); ++k) {
        auto o = cli.gen;
        o.keepLogits = !cli.logitsOut.empty();
        o.sampling.seed += k;
        const auto& p = cli.prompts[k];
        const auto prompt = at::tensor(p, at::kLong).view({1, static_cast<int64_t>(p.size())});
        const auto g = models::generate(*model, prompt, o);
        if (rank == 0) {
          fmt::print("ids: {}\n", fmt::join(g.tokens[0], ","));
          std::fflush(stdout);
          if (g.stoppedAtEos[0]) log::info("tessera_generate: prompt {} ended at the EOS id {}", k, o.eosId);
        }
        if (o.keepLogits) logits.emplace_back(fmt::format("prompt.{}", k), at::cat(g.logits, 0));
      }
      if (rank == 0 && !cli.logitsOut.empty()) hf::writeSafetensors(cli.logitsOut, logits);
      ctx.world->barrier()->wait();
    }
    std::fflush(nullptr);
    std::_Exit(0);  // as train_gpt: without LibTorch's static destructors
  } catch (const std::exception& e) {
    fmt::print(stderr, "tessera_generate: rank {}: error: {}\n", rank, e.what());
    std::fflush(stderr);
    return 1;
  }
}
