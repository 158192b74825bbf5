#pragma once
// The apps' start without a launcher: train_gpt and tessera_generate run alone, as rank 0 of 1 with
// a store of their own, when no launcher (torchrun, PMIx, Slurm) set the environment, instead of
// refusing to start ("no launcher found"). Reads the environment: call it at the top of main.
#include <cstdlib>

#include "tessera/comm/bootstrap/init.h"

namespace tessera::apps {

// Whether a launcher started this process.
inline bool launched() {
  for (const char* v : {"WORLD_SIZE", "PMIX_NAMESPACE", "SLURM_PROCID", "OMPI_COMM_WORLD_SIZE"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

// Without a launcher: `init` makes a world of this one process.
inline void aloneUnlessLaunched(InitOptions& init) {
  if (launched()) return;
  init.rank = 0;
  init.worldSize = 1;
  init.storePort = 0;  // a store of its own on a free port
}

}  // namespace tessera::apps
