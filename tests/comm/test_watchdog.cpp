// Reliability of communication (issues 9, 52): the collective checks (the default fingerprint and
// debug mode's store check) name the ranks that disagree and what each called; a failure dumps the
// flight record, aborts the process's other communicators and, when the main thread is stuck, ends
// the process (exit code 3).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "comm/watchdog/watchdog.h"
#include "harness/multiprocess.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

RunOptions debugRun(int ranks, std::string arg = "") {
  RunOptions o;
  o.ranks = ranks;
  o.timeout = std::chrono::seconds(60);
  o.env = {{"TESSERA_DEBUG", "detail"}, {"TESSERA_TIMEOUT_S", "3"}};
  o.arg = std::move(arg);
  return o;
}

// Two ranks, rank 1 leaves early on purpose: rank 0 is left to end on its own (no sibling kill).
RunOptions survivorRun(std::map<std::string, std::string> env) {
  RunOptions o;
  o.ranks = 2;
  o.timeout = std::chrono::seconds(60);
  o.killSiblingsOnFailure = false;
  o.env = std::move(env);
  return o;
}

}  // namespace

// Matching calls pass the check and still compute the right thing (20 ops: older keys are
// deleted as the sequence advances, so this also covers the clean-up).
TESSERA_WORKER(debug_matching_calls_pass) {
  auto ctx = initWorker(w);
  for (int k = 0; k < 20; ++k) {
    auto t = at::full({5}, static_cast<float>(w.rank + k));
    ctx.world->allReduce(t)->wait();
    float expect = static_cast<float>(w.world * k + w.world * (w.world - 1) / 2);
    WCHECK(t.equal(at::full({5}, expect)), "op {}: rank {} got {}", k, w.rank, t[0].item<float>());
  }
  auto b = at::full({2}, static_cast<float>(w.rank));
  ctx.world->broadcast(b, 1)->wait();
  WCHECK(b.equal(at::ones({2})), "broadcast gave {}", b[0].item<float>());
}
TEST(DebugMode, MatchingCallsPass) { expectAllOk(runWorkers("debug_matching_calls_pass", debugRun(3))); }

// Every rank fails, each naming every rank's call.
TESSERA_WORKER(debug_mismatch) {
  auto ctx = initWorker(w);
  const std::string kind = w.arg;
  auto call = [&] {
    if (kind == "shape") {
      ctx.world->allReduce(at::zeros({w.rank == 1 ? 5 : 4}))->wait();
    } else if (kind == "dtype") {
      ctx.world->allReduce(at::zeros({4}, w.rank == 1 ? at::kLong : at::kFloat))->wait();
    } else if (kind == "order") {
      if (w.rank == 1) ctx.world->broadcast(at::zeros({4}), 0)->wait();
      ctx.world->allReduce(at::zeros({4}))->wait();
    } else {
      throw std::runtime_error("unknown kind " + kind);
    }
  };
  if (kind == "shape") {
    expectErrorContaining(call, {"ranks of group 'world' disagree on collective #1", "rank 0",
                                 "all_reduce #1 (4 x float32, sum)\n  rank 1", "all_reduce #1 (5 x float32, sum)",
                                 w.rank == 0 ? "rank 0 (this rank)" : "rank 1 (this rank)"});
  } else if (kind == "dtype") {
    expectErrorContaining(call, {"disagree on collective #1", "all_reduce #1 (4 x int64, sum)",
                                 "rank 0", "all_reduce #1 (4 x float32, sum)"});
  } else {
    expectErrorContaining(call, {"disagree on collective #1", "rank 0", "all_reduce #1 (4 x float32, sum)",
                                 "broadcast #1 (4 x float32, root 0)"});
  }
}
TEST(DebugMode, ShapeMismatchNamesEveryRanksCall) {
  expectAllOk(runWorkers("debug_mismatch", debugRun(2, "shape")));
}
TEST(DebugMode, DtypeMismatchNamesEveryRanksCall) {
  expectAllOk(runWorkers("debug_mismatch", debugRun(2, "dtype")));
}
TEST(DebugMode, OpOrderMismatchNamesEveryRanksCall) {
  expectAllOk(runWorkers("debug_mismatch", debugRun(2, "order")));
}

// Rank 0 calls a collective on 'world', rank 1 on a sub-group 'dup' of the same ranks: each
// reports the other as missing, with the call it made instead.
TESSERA_WORKER(debug_group_mismatch) {
  auto ctx = initWorker(w);
  auto dup = ctx.world->split(0, w.rank, "dup");
  if (w.rank == 0) {
    expectErrorContaining([&] { ctx.world->allReduce(at::zeros({3}))->wait(); },
                          {"all_reduce #2 (3 x float32, sum) on group 'world' (rank 0 of 2)",
                           "not every rank of the group called it", "rank 1: process",
                           "its last collective call was all_reduce #1 (3 x float32, sum) on group 'dup'"});
  } else {
    expectErrorContaining([&] { dup->allReduce(at::zeros({3}))->wait(); },
                          {"all_reduce #1 (3 x float32, sum) on group 'dup' (rank 1 of 2)",
                           "rank 0: process", "on group 'world'"});
  }
}
TEST(DebugMode, GroupMismatchNamesWhatTheMissingRankCalled) {
  expectAllOk(runWorkers("debug_group_mismatch", debugRun(2)));
}

// Rank 1 skips the third all-reduce and exits; rank 0's op fails, the flight record is logged
// (with the failing op pending), the process's other communicator is aborted.
TESSERA_WORKER(failure_dumps_and_aborts_others) {
  auto ctx = initWorker(w);
  auto dup = ctx.world->split(0, w.rank, "dup");
  for (int k = 0; k < 2; ++k) ctx.world->allReduce(at::ones({8}))->wait();
  if (w.rank == 1) return;
  expectErrorContaining([&] { ctx.world->allReduce(at::ones({8}))->wait(); }, {"all_reduce #4", "group 'world'"});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the worker thread reports after failing the op
  expectErrorContaining([&] { dup->allReduce(at::ones({2}))->wait(); },
                        {"group 'dup'", "another communicator of this process failed", "all_reduce #4"});
}
TEST(Watchdog, FailureDumpsFlightRecordAndAbortsOtherCommunicators) {
  auto res = runWorkers("failure_dumps_and_aborts_others",
                        survivorRun({{"TESSERA_TIMEOUT_S", "2"}, {"TESSERA_EXIT_ON_ERROR", "0"}}));
  expectAllOk(res);
  const auto& out = res[0].output;
  EXPECT_NE(out.find("flight recorder (last collectives of each group, oldest first)"), std::string::npos) << out;
  EXPECT_NE(out.find("group 'world' (rank 0 of 2): last 4 of 4 ops"), std::string::npos) << out;
  EXPECT_NE(out.find("#4 all_reduce (8 x float32, sum) started"), std::string::npos) << out;
  EXPECT_NE(out.find(": PENDING"), std::string::npos) << out;
  EXPECT_EQ(out.find("group 'dup'"), std::string::npos) << "dup issued no op before the dump:\n" << out;
}

// The main thread is stuck (it never waits on the failed op): the watchdog ends the process
// with exit code 3 after the grace period, so the launcher sees a failed rank.
TESSERA_WORKER(stuck_main_thread) {
  auto ctx = initWorker(w);
  ctx.world->allReduce(at::ones({8}))->wait();
  if (w.rank == 1) return;
  auto lost = ctx.world->allReduce(at::ones({8}));  // rank 1 is gone: fails after the timeout
  std::this_thread::sleep_for(std::chrono::minutes(5));
  WCHECK(false, "the watchdog did not end the process");
}
TEST(Watchdog, StuckMainThreadIsEndedAfterTheGracePeriod) {
  auto res = runWorkers("stuck_main_thread", survivorRun({{"TESSERA_TIMEOUT_S", "2"}, {"TESSERA_EXIT_GRACE_S", "1"}}));
  EXPECT_TRUE(res[1].ok()) << res[1].output;
  EXPECT_FALSE(res[0].killedByHarness) << res[0].output;
  EXPECT_EQ(res[0].exitCode, watchdog::kExitCode) << res[0].output;
  EXPECT_LT(res[0].seconds, 2 + 1 + 10) << res[0].output;
  EXPECT_NE(res[0].output.find("exiting with code 3"), std::string::npos) << res[0].output;
}

// Fingerprint mode (the default): collectives whose ranks disagree fail on every rank with a
// catchable CommError naming every rank's call, before anything is sent (gloo's own threads would
// abort the process on a size mismatch, or the op would hang or return garbage). Each case runs on
// a group of its own, which the mismatch breaks; 'world' and matching ops are unaffected. The
// timeout (120 s) outlives the harness's (60 s): an ending run did not wait for it.
TESSERA_WORKER(fingerprint_mismatch) {
  auto ctx = initWorker(w);
  const bool odd = w.rank == 1;  // rank 1 calls something else than ranks 0 and 2
  const std::string me = w.rank == 1 ? "rank 1 (this rank)" : "ranks 0, 2 (this rank among them)";
  struct Case {
    const char* group;
    std::function<void(Communicator&)> call;
    const char* theirs;  // ranks 0 and 2
    const char* odd;     // rank 1
  };
  const std::vector<Case> cases = {
      {"ag", [&](Communicator& c) { c.allGather(at::empty({3 * (odd ? 5 : 4)}), at::ones({odd ? 5 : 4}))->wait(); },
       "all_gather of 4 x float32 per rank", "all_gather of 5 x float32 per rank"},
      {"ar", [&](Communicator& c) { c.allReduce(at::ones({odd ? 8 : 4}))->wait(); }, "all_reduce of 4 x float32 (sum)",
       "all_reduce of 8 x float32 (sum)"},
      {"op", [&](Communicator& c) { (odd ? c.broadcast(at::ones({4}), 0) : c.allReduce(at::ones({4})))->wait(); },
       "all_reduce of 4 x float32 (sum)", "broadcast of 4 x float32 from root 0"},
      {"dtype", [&](Communicator& c) { c.allReduce(at::ones({4}, odd ? at::kLong : at::kFloat))->wait(); },
       "all_reduce of 4 x float32 (sum)", "all_reduce of 4 x int64 (sum)"},
      {"root", [&](Communicator& c) { c.broadcast(at::ones({4}), odd ? 1 : 0)->wait(); },
       "broadcast of 4 x float32 from root 0", "broadcast of 4 x float32 from root 1"},
      {"red", [&](Communicator& c) { c.reduce(at::ones({4}), 2, odd ? ReduceOp::Max : ReduceOp::Sum)->wait(); },
       "reduce of 4 x float32 (sum) to root 2", "reduce of 4 x float32 (max) to root 2"},
  };
  for (const auto& k : cases) {
    auto sub = ctx.world->split(0, w.rank, k.group);
    sub->allReduce(at::ones({2}))->wait();  // matching: #1 passes
    const std::string ranks02 = fmt::format("{} called {}", w.rank == 1 ? "ranks 0, 2" : me, k.theirs);
    const std::string rank1 = fmt::format("{} called {}", w.rank == 1 ? me : "rank 1", k.odd);
    try {
      k.call(*sub);
      WCHECK(false, "group '{}': the mismatched collective did not fail", k.group);
    } catch (const CommError& e) {
      const std::string m = e.what();
      fmt::print("rank {}, group '{}': {}\n", w.rank, k.group, m);
      for (const auto& part : {fmt::format("#2 on group '{}' (rank {} of 3", k.group, w.rank),
                               std::string("the ranks called different collectives: "), ranks02 + "; " + rank1,
                               std::string("The op was not run (no tensor changed)")}) {
        WCHECK(m.find(part) != std::string::npos, "message '{}' lacks '{}'", m, part);
      }
    }
    // The group is broken now, on every rank alike: later ops fail with the first error.
    expectErrorContaining([&] { sub->barrier()->wait(); }, {"broken by an earlier failure", rank1.c_str()});
  }
  // 'world' still works, with inputs small enough to travel in the preamble and too large for it.
  for (int64_t n : {3, 10000}) {
    auto t = at::full({n}, w.rank + 1.0);
    ctx.world->allReduce(t)->wait();
    WCHECK(t.eq(6.0).all().item<bool>(), "world all_reduce of {} after the mismatches gave {}", n, t[0].item<double>());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the exit grace: no watchdog exit
}
TEST(CollectiveCheck, MismatchesFailEveryRankNamingEveryRanksCall) {
  expectAllOk(runWorkers("fingerprint_mismatch",
                         {.ranks = 3,
                          .timeout = std::chrono::seconds(60),
                          .env = {{"TESSERA_TIMEOUT_S", "120"}, {"TESSERA_EXIT_GRACE_S", "0.5"}}}));
}
