#include "harness/multiprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tessera/comm/store.h"
#include "harness/spawn.h"

extern char** environ;

namespace tessera::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::map<std::string, WorkerFn>& registry() {
  static std::map<std::string, WorkerFn> r;
  return r;
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "$RANK" → the worker's rank, "$STORE" → the harness store's port (whole value only).
std::string expandEnvValue(const std::string& v, int rank, uint16_t port) {
  if (v == "$RANK") return std::to_string(rank);
  if (v == "$STORE") return std::to_string(port);
  return v;
}

}  // namespace

bool registerWorker(const std::string& name, WorkerFn fn) {
  registry()[name] = std::move(fn);
  return true;
}

// Entered from main() when TESSERA_TEST_WORKER is set: runs one worker and exits.
int runWorkerFromEnv(const char* name) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    fmt::print(stderr, "harness: no worker named '{}'\n", name);
    return 2;
  }
  WorkerArgs w;
  w.rank = std::atoi(std::getenv("TESSERA_TEST_RANK"));
  w.world = std::atoi(std::getenv("TESSERA_TEST_WORLD"));
  w.storeHost = "127.0.0.1";
  w.storePort = static_cast<uint16_t>(std::atoi(std::getenv("TESSERA_TEST_STORE_PORT")));
  if (const char* a = std::getenv("TESSERA_TEST_ARG")) w.arg = a;
  try {
    it->second(w);
  } catch (const std::exception& e) {
    fmt::print(stderr, "WORKER FAILED rank {}: {}\n", w.rank, e.what());
    std::fflush(stderr);
    return 1;
  }
  std::fflush(stdout);
  return 0;
}

std::vector<RankResult> runWorkers(const std::string& worker, const RunOptions& opts) {
  // The parent hosts the store; every worker is a client (like torchrun's agent store).
  auto store = startStoreServer(0, opts.timeout);
  uint16_t port = storePort(store);
  char dirTemplate[] = "/tmp/tessera-test-XXXXXX";
  std::string dir = mkdtemp(dirTemplate);

  std::vector<RankResult> results(opts.ranks);
  std::vector<pid_t> pids(opts.ranks, 0);
  auto t0 = Clock::now();
  for (int r = 0; r < opts.ranks; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back("TESSERA_TEST_WORKER=" + worker);
    env.push_back(fmt::format("TESSERA_TEST_RANK={}", r));
    env.push_back(fmt::format("TESSERA_TEST_WORLD={}", opts.ranks));
    env.push_back(fmt::format("TESSERA_TEST_STORE_PORT={}", port));
    env.push_back("TESSERA_TEST_ARG=" + opts.arg);
    for (const auto& [k, v] : opts.env) env.push_back(k + "=" + expandEnvValue(v, r, port));
    pids[r] = spawnWorker(env, fmt::format("{}/rank{}.log", dir, r));
    results[r].rank = r;
  }

  int alive = opts.ranks;
  bool killAll = false;
  while (alive > 0) {
    bool timedOut = Clock::now() - t0 > opts.timeout;
    for (int r = 0; r < opts.ranks; ++r) {
      if (!pids[r]) continue;
      if (killAll || timedOut) {
        kill(pids[r], SIGKILL);
        results[r].killedByHarness = true;
      }
      int status = 0;
      if (!reapWorker(pids[r], killAll || timedOut, &status)) continue;
      results[r].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (WIFEXITED(status)) {
        results[r].exitCode = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        results[r].signal = WTERMSIG(status);
      }
      pids[r] = 0;
      --alive;
      if (!results[r].ok() && opts.killSiblingsOnFailure) killAll = true;
    }
    if (alive > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < opts.ranks; ++r) {
    results[r].output = readFile(fmt::format("{}/rank{}.log", dir, r));
    std::remove(fmt::format("{}/rank{}.log", dir, r).c_str());
  }
  rmdir(dir.c_str());
  return results;
}

void expectAllOk(const std::vector<RankResult>& results) {
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << "rank " << r.rank << " exit " << r.exitCode << " signal " << r.signal
                        << (r.killedByHarness ? " (killed by the harness: timeout or a sibling failed)" : "")
                        << " after " << r.seconds << " s; output:\n"
                        << r.output;
  }
}

Context initWorker(const WorkerArgs& w, std::optional<Backend> backend) {
  InitOptions o;
  o.rank = w.rank;
  o.worldSize = w.world;
  o.storeHost = w.storeHost;
  o.storePort = w.storePort;
  o.rank0HostsStore = false;
  o.backend = backend;
  return init(o);
}

}  // namespace tessera::testing
