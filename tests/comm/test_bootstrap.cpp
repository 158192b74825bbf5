// Bootstrap from the environment, through the same tessera::init() users call: torchrun's
// agent-store mode (prefix /worker/attempt_N), the explicit path, and the errors for a
// missing launcher and malformed variables.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"

using namespace tessera;
using namespace tessera::testing;

// Workers see torchrun's variables pointing at the harness's store, as under an elastic
// agent: every rank is a client, keys live under /worker/attempt_3/.
TESSERA_WORKER(torchrun_agent_store) {
  auto ctx = init();
  WCHECK(ctx.launch.launcher == "torchrun", "launcher {}", ctx.launch.launcher);
  WCHECK(ctx.launch.rank == w.rank && ctx.launch.worldSize == w.world, "rank {}/{}", ctx.launch.rank,
         ctx.launch.worldSize);
  WCHECK(ctx.launch.localRank == w.rank, "local rank {}", ctx.launch.localRank);
  WCHECK(!ctx.launch.hostsStore, "rank {} started a store although the agent has one", w.rank);
  WCHECK(ctx.launch.storePrefix == "/worker/attempt_3/tessera", "prefix {}", ctx.launch.storePrefix);
  auto t = at::full({2}, w.rank + 1.0);
  ctx.world->allReduce(t)->synchronize();
  WCHECK(t[0].item<double>() == w.world * (w.world + 1) / 2.0, "all_reduce gave {}", t[0].item<double>());
  // The key written through ctx.store is visible in the raw store under the attempt prefix.
  ctx.store->set(fmt::format("probe{}", w.rank), {'o', 'k'});
  auto raw = connectStore("127.0.0.1", w.storePort, std::chrono::seconds(10));
  auto v = raw->get(fmt::format("/worker/attempt_3/tessera/probe{}", w.rank));
  WCHECK(v.size() == 2 && v[0] == 'o', "key not under the attempt prefix");
}

TEST(Bootstrap, TorchrunAgentStorePrefix) {
  // The harness's store plays the elastic agent's store ($STORE = its port).
  RunOptions o;
  o.ranks = 3;
  o.env = {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
           {"TORCHELASTIC_RESTART_COUNT", "3"},
           {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", "$STORE"},
           {"WORLD_SIZE", "3"},
           {"RANK", "$RANK"},
           {"LOCAL_RANK", "$RANK"},
           {"LOCAL_WORLD_SIZE", "3"}};
  expectAllOk(runWorkers("torchrun_agent_store", o));
}

TESSERA_WORKER(no_launcher) {
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMIX_NAMESPACE", "SLURM_PROCID",
                        "SLURM_NTASKS"}) {
    unsetenv(v);
  }
  expectErrorContaining([] { init(); }, {"no launcher found"});
}

TEST(Bootstrap, NoLauncherIsAClearError) { expectAllOk(runWorkers("no_launcher", {.ranks = 1})); }

TESSERA_WORKER(bad_env) {
  setenv("RANK", "one", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  expectErrorContaining([] { init(); }, {"RANK='one' is not an integer"});
}

TEST(Bootstrap, MalformedVariableIsNamed) { expectAllOk(runWorkers("bad_env", {.ranks = 1})); }

TESSERA_WORKER(explicit_bad_rank) {
  InitOptions o;
  o.rank = 5;
  o.worldSize = 2;
  o.storePort = w.storePort;
  o.rank0HostsStore = false;
  expectErrorContaining([&] { init(o); }, {"rank 5 is not in [0, world size 2)"});
}

TEST(Bootstrap, RankOutsideWorldIsAClearError) { expectAllOk(runWorkers("explicit_bad_rank", {.ranks = 1})); }
