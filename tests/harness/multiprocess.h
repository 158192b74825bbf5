#pragma once
// Multi-process test harness: a test starts N copies of its own test binary as workers on
// localhost, with a TCPStore server in the parent, a per-run timeout, and kills the siblings
// when one fails or hangs. Workers are plain functions registered with TESSERA_WORKER; they
// report failure by throwing (WCHECK) and the parent asserts on exit codes and output.
//
//   TESSERA_WORKER(allreduce_sum) {            // runs in every child; `w` is WorkerArgs
//     auto ctx = tessera::testing::initWorker(w);
//     ...
//     WCHECK(x.equal(expected), "rank {} got {}", w.rank, ...);
//   }
//   TEST(Comm, AllReduce) { expectAllOk(runWorkers("allreduce_sum", {.ranks = 4})); }
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/comm/bootstrap/init.h"

namespace tessera::testing {

struct WorkerArgs {
  int rank = 0, world = 1;
  std::string storeHost;
  uint16_t storePort = 0;
  std::string arg;  // RunOptions::arg, passed through unchanged
};

using WorkerFn = std::function<void(const WorkerArgs&)>;
bool registerWorker(const std::string& name, WorkerFn fn);

struct RunOptions {
  int ranks = 2;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);  // whole run
  // Extra environment; a value "$RANK" becomes the worker's rank, "$STORE" the port of the
  // harness's store (e.g. to pose as torchrun's agent store).
  std::map<std::string, std::string> env;
  std::string arg;
  // When a worker fails, kill the others at once (default); false lets them run to their
  // own end (used by fault tests, which check how the survivors end).
  bool killSiblingsOnFailure = true;
};

struct RankResult {
  int rank = 0;
  int exitCode = -1;  // -1 when killed by a signal
  int signal = 0;
  bool killedByHarness = false;  // timed out or killed because a sibling failed
  double seconds = 0;            // from start to exit
  std::string output;            // stdout + stderr
  bool ok() const { return exitCode == 0 && !killedByHarness; }
};

std::vector<RankResult> runWorkers(const std::string& worker, const RunOptions& opts);
// gtest assertion: every rank exited 0; prints each failing rank's output otherwise.
void expectAllOk(const std::vector<RankResult>& results);
// Init through tessera::init with explicit rank/world and the harness's store (gloo unless
// TESSERA_BACKEND says otherwise).
Context initWorker(const WorkerArgs& w, std::optional<Backend> backend = Backend::Gloo);

// In workers: throws with the message when the condition fails.
#define WCHECK(cond, ...)                                                                        \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw std::runtime_error(fmt::format("WCHECK({}) failed at {}:{}: {}", #cond, __FILE__, __LINE__, \
                                           fmt::format(__VA_ARGS__)));                           \
  } while (0)

// In workers: runs `fn`, which must throw a std::exception whose message contains every
// one of `parts`; throws (failing the worker) otherwise.
template <typename F>
void expectErrorContaining(F&& fn, std::initializer_list<const char*> parts) {
  std::string m;
  try {
    fn();
  } catch (const std::exception& e) {
    m = e.what();
  }
  WCHECK(!m.empty(), "no error thrown (expected one containing '{}')", *parts.begin());
  for (const char* p : parts) WCHECK(m.find(p) != std::string::npos, "message '{}' lacks '{}'", m, p);
}

#define TESSERA_WORKER(name)                                                                   \
  static void tessera_worker_##name(const ::tessera::testing::WorkerArgs& w);                  \
  static const bool tessera_worker_reg_##name =                                                \
      ::tessera::testing::registerWorker(#name, tessera_worker_##name);                        \
  static void tessera_worker_##name(const ::tessera::testing::WorkerArgs& w)

}  // namespace tessera::testing
