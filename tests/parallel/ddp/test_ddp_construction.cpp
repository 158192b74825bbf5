// DistributedDataParallel's construction: every rank raises the same error when any rank's
// arguments are unusable or the ranks differ (requires_grad, options, buffers, no
// parameters): never a rank left waiting.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include <fmt/ranges.h>

#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "parallel/ddp/ddp.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(ddp_requires_grad_mismatch) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  if (w.rank == 1) m->fc2->bias.set_requires_grad(false);
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world); },
                        {"the ranks' parameters differ", "at parameter #3:", "rank 0 has 'fc2.bias' [32] float32;",
                         "rank 1 has 'fc2.bias' [32] float32 requires_grad=false"});
}

TEST(DdpConstruction, RequiresGradMismatchIsNamed) {
  expectAllOk(runWorkers("ddp_requires_grad_mismatch", {.ranks = 2}));
}

// Rank 2 alone changes one option at a time; every rank names it and each rank's value.
TESSERA_WORKER(ddp_option_mismatch) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  struct Case {
    std::function<void(DdpOptions&)> set;
    const char* usual;
    const char* changed;
  };
  const Case cases[] = {
      {[](DdpOptions& o) { o.bucketCapBytes = 1024; }, "bucketCapBytes=26214400", "bucketCapBytes=1024"},
      {[](DdpOptions& o) { o.firstBucketCapBytes = 4096; }, "firstBucketCapBytes=1048576", "firstBucketCapBytes=4096"},
      {[](DdpOptions& o) { o.findUnusedParameters = true; }, "findUnusedParameters=false", "findUnusedParameters=true"},
      {[](DdpOptions& o) { o.commDtype = at::kBFloat16; }, "commDtype=unset", "commDtype=bfloat16"},
      {[](DdpOptions& o) { o.gradientAsBucketView = true; }, "gradientAsBucketView=false", "gradientAsBucketView=true"},
      {[](DdpOptions& o) { o.broadcastBuffers = false; }, "broadcastBuffers=true", "broadcastBuffers=false"},
      {[](DdpOptions& o) { o.rebuildBuckets = false; }, "rebuildBuckets=true", "rebuildBuckets=false"},
  };
  for (const auto& c : cases) {
    DdpOptions o;
    if (w.rank == 2) c.set(o);
    auto r0 = fmt::format("rank 0 has {};", c.usual), r1 = fmt::format("rank 1 has {};", c.usual);
    auto r2 = fmt::format("rank 2 has {}", c.changed);
    expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o); },
                          {"the ranks' options differ", r0.c_str(), r1.c_str(), r2.c_str()});
  }
  // Options local to a rank may differ; agreeing ranks construct.
  DdpOptions o;
  o.smCarveout = w.rank;
  DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o);
}

TEST(DdpConstruction, OptionMismatchIsNamedOnEveryRank) {
  expectAllOk(runWorkers("ddp_option_mismatch", {.ranks = 3}));
}

TESSERA_WORKER(ddp_buffer_mismatch) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  auto count = at::zeros({1}, at::kLong);
  DistributedDataParallel::Named shapes = {{"count", count}, {"stats", at::zeros({w.rank == 1 ? 3 : 4})}};
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), shapes, ctx.world); },
                        {"the ranks' buffers differ (count per rank: 2, 2); first difference at buffer #1:",
                         "rank 0 has 'stats' [4] float32;", "rank 1 has 'stats' [3] float32"});
  DistributedDataParallel::Named extra = {{"count", count}};
  if (w.rank == 0) extra.emplace_back("stats", at::zeros({4}));
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), extra, ctx.world); },
                        {"count per rank: 2, 1", "rank 0 has 'stats' [4] float32;", "rank 1 has (none)"});
  // A buffer no collective can carry, on one rank: its problem, on every rank.
  auto stats = at::zeros({4}, w.rank == 1 ? at::kDouble : at::kFloat);
  DistributedDataParallel::Named dtypes = {{"count", count}, {"stats", stats}};
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), dtypes, ctx.world); },
                        {"DistributedDataParallel: on rank 1: buffer 'stats' has dtype float64"});
}

TEST(DdpConstruction, BufferMismatchIsNamed) { expectAllOk(runWorkers("ddp_buffer_mismatch", {.ranks = 2})); }

// arg: one (rank 1 passes no parameters), all (no rank does), frozen (rank 1's parameters
// all have requires_grad=false). Every rank raises the same error, at once.
TESSERA_WORKER(ddp_no_parameters) {
  auto ctx = initWorker(w);
  ctx.world->setTimeout(std::chrono::seconds(30));
  auto m = makeTinyMlp(1);
  auto params = namedParameters(*m);
  if (w.arg == "all" || (w.arg == "one" && w.rank == 1)) params.clear();
  if (w.arg == "frozen" && w.rank == 1) {
    for (auto& [name, p] : params) p.set_requires_grad(false);
  }
  const char* want = w.arg == "all"      ? "DistributedDataParallel: on ranks 0, 1: no parameters given"
                     : w.arg == "frozen" ? "DistributedDataParallel: on rank 1: no parameter requires a gradient"
                                         : "DistributedDataParallel: on rank 1: no parameters given";
  auto t0 = std::chrono::steady_clock::now();
  expectErrorContaining([&] { DistributedDataParallel ddp(params, {}, ctx.world); }, {want});
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WCHECK(secs < 10, "rank {} raised after {:.1f} s: it waited for another rank", w.rank, secs);
}

TEST(DdpConstruction, NoParametersIsTheSameErrorOnEveryRank) {
  for (const char* arg : {"one", "all", "frozen"}) {
    SCOPED_TRACE(arg);
    expectAllOk(runWorkers("ddp_no_parameters", {.ranks = 2, .arg = arg}));
  }
}
