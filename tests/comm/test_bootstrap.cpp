// Bootstrap from the environment, through the same tessera::init() users call: torchrun's
// agent-store mode (prefix /worker/attempt_N), the explicit path, and the errors for a
// missing launcher and malformed variables.
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <stdexcept>
#include <thread>

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

// torchrun-style variables that are incomplete or contradict each other are named, instead of
// falling through to another launcher or a hang.
TESSERA_WORKER(torchrun_env_errors) {
  auto set = [](std::map<std::string, std::string> vars) {
    for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "TORCHELASTIC_USE_AGENT_STORE", "PMIX_NAMESPACE", "SLURM_PROCID", "SLURM_NTASKS"}) {
      unsetenv(v);
    }
    for (auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  };
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  expectErrorContaining([] { init(); }, {"RANK/WORLD_SIZE are set but MASTER_ADDR, MASTER_PORT are not"});
  set({{"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  expectErrorContaining([] { init(); }, {"WORLD_SIZE is not"});
  set({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  expectErrorContaining([] { init(); }, {"RANK=2 is not in [0, WORLD_SIZE=2)"});
  set({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
       {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}});
  expectErrorContaining([] { init(); }, {"LOCAL_RANK=3 and LOCAL_WORLD_SIZE=2 contradict"});
  set({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
       {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}});
  expectErrorContaining([] { init(); }, {"LOCAL_WORLD_SIZE=8", "WORLD_SIZE=4"});
}
TEST(Bootstrap, IncompleteOrContradictoryTorchrunVariablesAreNamed) {
  expectAllOk(runWorkers("torchrun_env_errors", {.ranks = 1}));
}

// The store's host (rank 0 under torchrun without an agent store) dies right after starting the
// store: every other rank must end with an error, within the timeout + 10 s, never hang.
TESSERA_WORKER(store_host_dies) {
  auto ctx = init();
  WCHECK(false, "rank {} finished init although the store's host died", w.rank);
}
TEST(Bootstrap, StoreHostDyingDuringStartUpEndsEveryRank) {
  int port = 0;
  {  // a free port for rank 0's store
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  const double timeoutS = 5;
  RunOptions o;
  o.ranks = 3;
  o.timeout = std::chrono::seconds(60);
  o.killSiblingsOnFailure = false;
  o.env = {{"RANK", "$RANK"},           {"WORLD_SIZE", "3"},
           {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
           {"TESSERA_TIMEOUT_S", "5"},   {"TESSERA_FAULT_INJECT", "bootstrap-after-store:0"}};
  auto res = runWorkers("store_host_dies", o);
  EXPECT_EQ(res[0].signal, SIGKILL) << res[0].output;
  for (int r = 1; r < 3; ++r) {
    fmt::print("rank {} ended after {:.2f} s, exit {}, signal {}:\n{}\n", r, res[r].seconds, res[r].exitCode,
               res[r].signal, res[r].output);
    EXPECT_FALSE(res[r].killedByHarness) << "rank " << r << " hung:\n" << res[r].output;
    EXPECT_EQ(res[r].exitCode, 1) << "rank " << r << " crashed (signal " << res[r].signal << ") or hung:\n"
                                  << res[r].output;
    EXPECT_LT(res[r].seconds, timeoutS + 10) << res[r].output;
    EXPECT_NE(res[r].output.find("tessera"), std::string::npos) << res[r].output;
    EXPECT_EQ(res[r].output.find("finished init"), std::string::npos) << res[r].output;
  }
}

// Ranks started by hand (torchrun's variables, no agent store) on a port that another program's
// store holds (here the harness's, as a torchrun agent's would be): rank 0 cannot host the store and
// says whose the port is; the others reached that store and must not wait there for the whole
// timeout (120 s; the run's limit is 60 s): rank 0 leaves them word, and they end naming the port.
TESSERA_WORKER(port_held_by_a_foreign_store) {
  std::string m;
  try {
    init();
  } catch (const std::exception& e) {
    m = e.what();
  }
  fmt::print("rank {}: {}\n", w.rank, m);
  const auto held = fmt::format("another process holds port {} (it answers as a store, but no tessera job announced "
                                "itself there); give this job a port of its own (MASTER_PORT, TESSERA_STORE_PORT)",
                                w.storePort);
  WCHECK(m.find(held) != std::string::npos, "rank {}: '{}' lacks '{}'", w.rank, m, held);
  if (w.rank > 0) {
    const auto word = fmt::format("rank {} of 3, store client of 127.0.0.1:{}, keys under 'tessera'): the store at "
                                  "127.0.0.1:{} is not this job's: this job's rank 0 (host ",
                                  w.rank, w.storePort, w.storePort);
    WCHECK(m.find(word) != std::string::npos, "rank {}: '{}' lacks '{}'", w.rank, m, word);
    WCHECK(m.find("could not start its store there") != std::string::npos, "rank {}: {}", w.rank, m);
  }
}
TEST(Bootstrap, PortHeldByAForeignStoreEndsEveryRankNamingThePort) {
  RunOptions o;
  o.ranks = 3;
  o.timeout = std::chrono::seconds(60);
  o.killSiblingsOnFailure = false;
  o.env = {{"RANK", "$RANK"},           {"WORLD_SIZE", "3"},         {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", "$STORE"},   {"TESSERA_TIMEOUT_S", "120"}};
  expectAllOk(runWorkers("port_held_by_a_foreign_store", o));
}

// An exception escaping a thread after init() (as a library's socket thread does when a peer
// vanishes) ends the process with exit 1 and the exception's message, not a bare abort.
TESSERA_WORKER(thread_throws) {
  auto ctx = initWorker(w);
  std::thread([] { throw std::runtime_error("peer went away (injected by the test)"); }).join();
  WCHECK(false, "the process survived an exception escaping its thread");
}
TEST(Bootstrap, ExceptionEscapingAThreadEndsTheRankWithItsMessage) {
  auto res = runWorkers("thread_throws", {.ranks = 1, .timeout = std::chrono::seconds(60)});
  EXPECT_EQ(res[0].signal, 0) << res[0].output;
  EXPECT_EQ(res[0].exitCode, 1) << res[0].output;
  EXPECT_NE(res[0].output.find("tessera: fatal: uncaught exception in a thread"), std::string::npos) << res[0].output;
  EXPECT_NE(res[0].output.find("peer went away (injected by the test)"), std::string::npos) << res[0].output;
}
