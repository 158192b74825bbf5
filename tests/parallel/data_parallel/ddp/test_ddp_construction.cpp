// DistributedDataParallel's construction and state: every rank raises the same error when any
// rank's arguments are unusable or the ranks differ (requires_grad, options, buffers, no
// parameters: never a rank left waiting); buffers are broadcast from rank 0 at construction
// and by syncBuffers() unless broadcastBuffers is off (ddp::broadcastTensors, in buckets); the
// default bucket caps and the layout they give a known model.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include <fmt/ranges.h>

#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "parallel/data_parallel/ddp/param_sync.h"

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

// arg "1": broadcastBuffers (default), "0": off. Ranks start with different buffers.
TESSERA_WORKER(ddp_buffers) {
  const bool broadcast = w.arg == "1";
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  auto stats = at::full({4}, 1.0f + w.rank);
  auto count = at::full({2}, 10 * (w.rank + 1), at::kLong);
  DdpOptions o;
  o.broadcastBuffers = broadcast;
  DistributedDataParallel ddp(namedParameters(*m), {{"stats", stats}, {"count", count}}, ctx.world, o);
  // Construction broadcasts rank 0's, whatever broadcastBuffers says.
  WCHECK(stats.equal(at::full({4}, 1.0f)) && count.equal(at::full({2}, 10, at::kLong)),
         "rank {} after construction: stats {}, count {}", w.rank, stats[0].item<float>(), count[0].item<int64_t>());
  for (int step = 0; step < 2; ++step) {
    stats.fill_(100.0f * (step + 1) + w.rank);  // as a forward updates BatchNorm's statistics
    count.add_(w.rank + 1);
    ddp.syncBuffers();
    const float want = 100.0f * (step + 1) + (broadcast ? 0 : w.rank);
    const int64_t wantCount = broadcast ? 10 + step + 1 : 10 + (step + 1) * (w.rank + 1);
    WCHECK(stats.equal(at::full({4}, want)) && count.equal(at::full({2}, wantCount, at::kLong)),
           "rank {} step {}: stats {} (want {}), count {} (want {})", w.rank, step, stats[0].item<float>(), want,
           count[0].item<int64_t>(), wantCount);
  }
}

TEST(DdpConstruction, BuffersComeFromRankZero) {
  for (const char* arg : {"1", "0"}) {
    SCOPED_TRACE(arg);
    expectAllOk(runWorkers("ddp_buffers", {.ranks = 3, .arg = arg}));
  }
}

TEST(DdpConstruction, DefaultOptions) {
  DdpOptions o;
  EXPECT_EQ(o.bucketCapBytes, 25u << 20);
  EXPECT_EQ(o.firstBucketCapBytes, 1u << 20);
  EXPECT_FALSE(o.gradientAsBucketView);
  EXPECT_FALSE(o.commDtype.has_value());
  EXPECT_FALSE(o.findUnusedParameters);
  EXPECT_TRUE(o.broadcastBuffers);
  EXPECT_TRUE(o.rebuildBuckets);
}

// Float32 parameters, registered in this order (buckets start from the last): the 1 MiB first
// bucket closes at head.weight (exactly 1 MiB; with head.bias just over), the 25 MiB one at emb
// (12 + 12 MiB and two biases are just under 25 MiB), and `in` is left in a bucket of its own.
TESSERA_WORKER(ddp_default_layout) {
  auto ctx = initWorker(w);
  auto p = [](int64_t n) { return at::zeros({n}).requires_grad_(); };
  DistributedDataParallel::Named params = {
      {"in", p(256)},              {"emb", p(1 << 20)},         {"l1.weight", p(3 << 20)},
      {"l1.bias", p(1024)},        {"l2.weight", p(3 << 20)},   {"l2.bias", p(1024)},
      {"head.weight", p(1 << 18)}, {"head.bias", p(256)},
  };
  DistributedDataParallel ddp(params, {}, ctx.world);
  const std::vector<std::vector<std::string>> want = {
      {"head.bias", "head.weight"}, {"l2.bias", "l2.weight", "l1.bias", "l1.weight", "emb"}, {"in"}};
  auto got = ddp.bucketLayout();
  WCHECK(got == want, "default layout: {}", fmt::join(got, " | "));
}

TEST(DdpConstruction, DefaultCapsGiveTheExpectedLayout) {
  expectAllOk(runWorkers("ddp_default_layout", {.ranks = 2}));
}

// ddp::broadcastTensors in buckets (a small cap here, 256 MiB by default): tensors of two dtypes,
// one larger than the cap (broadcast alone, in place), a non-contiguous one larger than the cap
// (through a copy), small ones packed several to a bucket and one empty: every rank ends with
// rank 1's values bit for bit.
TESSERA_WORKER(ddp_broadcast_buckets) {
  auto ctx = initWorker(w);
  auto make = [](int seed) {
    auto g = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
    return std::vector<at::Tensor>{
        at::randn({40, 30}, g),                                    // 4800 B: alone (cap 4096)
        at::randn({3, 5}, g),                                      // small: bucketed
        at::randint(0, 100, {7}, g, at::kLong),                    // another dtype
        at::randn({64, 20}, g).t(),                                // non-contiguous, 5120 B: alone, copied
        at::randn({11}, g),  at::randn({0}, g), at::randn({200}, g),  // a bucket of two (44 + 800 B)
        at::randint(0, 100, {600}, g, at::kLong),                  // 4800 B long: alone
    };
  };
  auto mine = make(100 + w.rank), want = make(101);
  ddp::broadcastTensors(*ctx.world, mine, /*root=*/1, /*bucketBytes=*/4096);
  for (size_t k = 0; k < mine.size(); ++k) {
    WCHECK(at::equal(mine[k], want[k]), "rank {}: tensor {} differs from rank 1's", w.rank, k);
  }
  WCHECK(!mine[3].is_contiguous(), "the transposed tensor should stay a transposed view");
}

TEST(DdpConstruction, BroadcastInBucketsCopiesTheRootsValues) {
  expectAllOk(runWorkers("ddp_broadcast_buckets", {.ranks = 3}));
}
