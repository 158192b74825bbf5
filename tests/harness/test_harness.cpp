// The multi-process harness itself (multiprocess.h, spawn.h): workers forked from the zygote get
// exactly the environment runWorkers computes at the call, their output and exit status come back,
// a crash or a hang ends as a signal or a harness kill (never a stuck test), and the zygote
// survives all of it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "harness/multiprocess.h"

using namespace tessera::testing;

namespace {

std::string envOr(const char* k, const char* d) {
  const char* v = std::getenv(k);
  return v ? v : d;
}

// arg "K=V": the worker's variable K must be V ("<unset>" when it must be absent).
TESSERA_WORKER(env_probe) {
  const auto eq = w.arg.find('=');
  const std::string k = w.arg.substr(0, eq), want = w.arg.substr(eq + 1);
  const std::string got = envOr(k.c_str(), "<unset>");
  WCHECK(got == want, "rank {}: {}={}, expected {}", w.rank, k, got, want);
  WCHECK(envOr("TESSERA_HARNESS_RANK", "") == std::to_string(w.rank), "rank {}: $RANK not expanded", w.rank);
  fmt::print("rank {} of {} saw {}={}\n", w.rank, w.world, k, got);
}

// Rank 1 fails (arg "throw"), crashes ("abort", "segv"); the others wait for their kill.
TESSERA_WORKER(misbehave) {
  if (w.rank == 1) {
    if (w.arg == "throw") throw std::runtime_error("rank 1 fails on purpose");
    if (w.arg == "abort") std::abort();
    if (w.arg == "segv") raise(SIGSEGV);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

TESSERA_WORKER(sleeper) { std::this_thread::sleep_for(std::chrono::seconds(60)); }

RunOptions opts(int ranks, std::string arg) {
  RunOptions o;
  o.ranks = ranks;
  o.arg = std::move(arg);
  o.env = {{"TESSERA_HARNESS_RANK", "$RANK"}};
  return o;
}

TEST(Harness, WorkersGetTheEnvironmentOfTheCall) {
  // Set and unset after main() started the zygote: the workers must see the state at the call.
  setenv("TESSERA_HARNESS_PROBE", "first", 1);
  auto r = runWorkers("env_probe", opts(3, "TESSERA_HARNESS_PROBE=first"));
  expectAllOk(r);
  EXPECT_NE(r[2].output.find("rank 2 of 3 saw TESSERA_HARNESS_PROBE=first"), std::string::npos) << r[2].output;
  unsetenv("TESSERA_HARNESS_PROBE");
  expectAllOk(runWorkers("env_probe", opts(2, "TESSERA_HARNESS_PROBE=<unset>")));
  auto o = opts(2, "TESSERA_HARNESS_PROBE=from-options");
  o.env["TESSERA_HARNESS_PROBE"] = "from-options";
  expectAllOk(runWorkers("env_probe", o));
}

TEST(Harness, AFailingWorkerEndsTheRunWithItsMessage) {
  auto r = runWorkers("misbehave", opts(3, "throw"));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].exitCode, 1);
  EXPECT_NE(r[1].output.find("WORKER FAILED rank 1: rank 1 fails on purpose"), std::string::npos) << r[1].output;
  for (int k : {0, 2}) {
    EXPECT_TRUE(r[k].killedByHarness) << "rank " << k;
    EXPECT_LT(r[k].seconds, 30) << "rank " << k << " was not killed when rank 1 failed";
  }
}

TEST(Harness, ACrashIsASignalAndTheNextRunStillWorks) {
  for (const char* how : {"abort", "segv"}) {
    auto r = runWorkers("misbehave", opts(2, how));
    EXPECT_EQ(r[1].signal, std::string(how) == "abort" ? SIGABRT : SIGSEGV) << how << ": " << r[1].output;
    EXPECT_FALSE(r[1].ok()) << how;
    EXPECT_TRUE(r[0].killedByHarness) << how;
  }
  expectAllOk(runWorkers("env_probe", opts(2, "TESSERA_HARNESS_UNSET_VARIABLE=<unset>")));
}

TEST(Harness, AHangIsKilledAtTheTimeout) {
  auto o = opts(2, "");
  o.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = runWorkers("sleeper", o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30);
  for (const auto& x : r) {
    EXPECT_TRUE(x.killedByHarness) << "rank " << x.rank;
    EXPECT_EQ(x.signal, SIGKILL) << "rank " << x.rank;
  }
}

TEST(Harness, AnUnknownWorkerIsAnError) {
  auto r = runWorkers("no_such_worker", opts(1, ""));
  EXPECT_EQ(r[0].exitCode, 2);
  EXPECT_NE(r[0].output.find("no worker named 'no_such_worker'"), std::string::npos) << r[0].output;
}

}  // namespace
