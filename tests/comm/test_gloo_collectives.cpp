// Every collective of the Gloo communicator for 1-4 ranks and every dtype, against
// hand-computed results; input validation errors; timeouts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "comm/collectives_suite.h"
#include "harness/multiprocess.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(gloo_suite) {
  auto ctx = initWorker(w);
  WCHECK(ctx.world->size() == w.world && ctx.world->rank() == w.rank, "world is {} of {}", ctx.world->rank(),
         ctx.world->size());
  runCollectiveSuite(*ctx.world, at::TensorOptions().device(at::kCPU));
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, EveryOpEveryDtypeMatchesHandComputed) {
  expectAllOk(runWorkers("gloo_suite", {.ranks = GetParam(), .timeout = std::chrono::seconds(120)}));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(1, 2, 3, 4));

TESSERA_WORKER(gloo_bad_inputs) {
  auto ctx = initWorker(w);
  auto& c = *ctx.world;
  auto ok = at::ones({8});
  expectErrorContaining([&] { c.allReduce(at::ones({4, 4}).t()); }, {"all_reduce", "not contiguous", "rank"});
  expectErrorContaining([&] { c.allReduce(at::ones({4}, at::kDouble)); }, {"all_reduce", "float64", "group 'world'"});
  expectErrorContaining([&] { c.allReduce(at::ones({4}, at::kBool)); }, {"all_reduce", "dtype"});
  expectErrorContaining([&] { c.allReduce(at::Tensor()); }, {"all_reduce", "undefined"});
  expectErrorContaining([&] { c.allReduce(at::empty({4}, at::Device(at::kMeta))); }, {"all_reduce", "meta", "CPU tensors"});
  expectErrorContaining([&] { c.allGather(at::empty({7}), ok); }, {"all_gather", "output has 7 elements", "= 16"});
  expectErrorContaining([&] { c.allGather(at::empty({16}, at::kHalf), ok); }, {"all_gather", "float16", "float32"});
  expectErrorContaining([&] { c.reduceScatter(at::empty({3}), at::ones({7})); }, {"reduce_scatter", "divisible"});
  expectErrorContaining([&] { c.allToAll(at::empty({7}), at::ones({7})); }, {"all_to_all", "not divisible by the group size 2"});
  expectErrorContaining([&] { c.allToAll(at::empty({6}), at::ones({8})); }, {"all_to_all", "must be equal"});
  expectErrorContaining([&] { c.broadcast(ok, 5); }, {"broadcast", "root 5"});
  expectErrorContaining([&] { c.reduce(ok, -1); }, {"reduce", "root -1"});
  expectErrorContaining([&] { c.send(ok, w.rank); }, {"send", "peer rank", "self"});
  expectErrorContaining([&] { c.recv(ok, 9); }, {"recv", "peer rank 9"});
  expectErrorContaining([&] { c.batchP2P({}); }, {"batch_p2p", "no operations"});
  // Validation failures send nothing: the communicator still works afterwards.
  auto t = at::full({3}, w.rank + 1.0);
  c.allReduce(t)->synchronize();
  WCHECK(t.eq(3.0).all().item<bool>(), "all_reduce after validation errors gave {}", t.sum().item<double>());
}

TEST(GlooCommunicator, BadInputsGiveClearErrorsAndSendNothing) {
  expectAllOk(runWorkers("gloo_bad_inputs", {.ranks = 2}));
}

// Rank 1 never joins the second all-reduce: rank 0's op must time out with the op, group,
// sequence number and elapsed time in its message, not hang.
TESSERA_WORKER(gloo_timeout) {
  auto ctx = initWorker(w);
  ctx.world->setTimeout(std::chrono::milliseconds(1500));
  auto t = at::ones({16});
  ctx.world->allReduce(t)->synchronize();
  if (w.rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    ctx.world->allReduce(t)->synchronize();
  } catch (const CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string m = e.what();
    fmt::print("rank 0 got: {}\n", m);
    WCHECK(m.find("all_reduce #2 on group 'world'") != std::string::npos, "message: {}", m);
    WCHECK(m.find("rank 0 of 2") != std::string::npos, "message: {}", m);
    WCHECK(m.find(" s") != std::string::npos, "no elapsed time in: {}", m);
    WCHECK(s >= 1.4 && s < 6.0, "timed out after {} s, timeout was 1.5 s", s);
    // The communicator is broken now: later ops fail at once with the first error.
    bool threw = false;
    try {
      ctx.world->barrier()->synchronize();
    } catch (const CommError& e2) {
      threw = std::string(e2.what()).find("broken") != std::string::npos;
    }
    WCHECK(threw, "barrier after the failure did not report the broken communicator");
    return;
  }
  WCHECK(false, "all_reduce without its peer did not time out");
}

TEST(GlooCommunicator, TimeoutNamesOpGroupSeqAndElapsed) {
  expectAllOk(runWorkers("gloo_timeout", {.ranks = 2, .timeout = std::chrono::seconds(30)}));
}

TEST(GlooCommunicator, DefaultTimeoutComesFromEnvironment) {
  // defaultTimeout() is read once per process: check it in a child.
  expectAllOk(runWorkers("gloo_env_timeout", {.ranks = 1, .env = {{"TESSERA_TIMEOUT_S", "2.5"}}}));
}

TESSERA_WORKER(gloo_env_timeout) {
  auto ctx = initWorker(w);
  WCHECK(ctx.world->timeout() == std::chrono::milliseconds(2500), "timeout is {} ms", ctx.world->timeout().count());
}

// split(): a rank with color < 0 takes part in the split but gets no communicator; keys
// order the new ranks (here reversed).
TESSERA_WORKER(gloo_split) {
  auto ctx = initWorker(w);
  auto sub = ctx.world->split(w.rank == 0 ? -1 : 7, -w.rank, "others");
  if (w.rank == 0) {
    WCHECK(sub == nullptr, "rank 0 asked for no group but got '{}'", sub->name());
  } else {
    WCHECK(sub && sub->size() == w.world - 1, "group size {}", sub ? sub->size() : -1);
    WCHECK(sub->rank() == w.world - 1 - w.rank, "world rank {} has rank {} in the reversed group", w.rank,
           sub->rank());
    auto t = at::full({5}, static_cast<int64_t>(w.rank), at::kLong);
    sub->allReduce(t)->synchronize();
    int64_t want = static_cast<int64_t>(w.world) * (w.world - 1) / 2;
    WCHECK(t[0].item<int64_t>() == want, "sum over ranks 1.. is {} want {}", t[0].item<int64_t>(), want);
  }
  // The parent still works after the split, on every rank.
  ctx.world->barrier()->synchronize();
}

TEST(GlooCommunicator, SplitWithNegativeColorAndReversedKeys) { expectAllOk(runWorkers("gloo_split", {.ranks = 3})); }
