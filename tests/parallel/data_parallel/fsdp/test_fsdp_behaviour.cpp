// FullyShardedDataParallel behaviour on Gloo: prefetch depth under a memory budget
// (instrumented peak of unsharded units), state-dict round trips, a unit whose forward leaves
// some of its parameters unused, clipping, and the warning for a unit run twice (the clear
// errors: test_fsdp_errors.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"
#include "parallel/data_parallel/fsdp/fsdp_task.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

std::map<std::string, at::Tensor> trainAndGather(const Setup& s, FsdpOptions o, const Context& ctx, int rank,
                                                 FsdpStats* stats, size_t* rootBytes, size_t* blockBytes) {
  auto task = makeTask(s, 100);
  FullyShardedDataParallel fsdp(task.units, ctx.world, o);
  ShardedAdamW opt(fsdp, {.lr = 1e-3});
  const size_t elem = c10::elementSize(o.paramDtype);
  if (rootBytes) *rootBytes = fsdp.layout(0).paddedNumel * elem;
  if (blockBytes) *blockBytes = fsdp.layout(1).paddedNumel * elem;
  for (int step = 0; step < 3; ++step) fsdpStep(fsdp, opt, task, step, 1, rank, 0);
  if (stats) *stats = fsdp.stats();
  WCHECK(fsdp.stats().unshardedUnits == 0, "{} units still unsharded after backward", fsdp.stats().unshardedUnits);
  return fsdp.fullStateDict();
}

}  // namespace

// GPT with 4 blocks: root (never resharded between forward and backward) + 4 block units.
// Budget 0: no prefetch, at most root + the running block alive. Budget root + 2 blocks:
// one block prefetched, never more than 3 alive. Unlimited: every block gathered ahead in
// forward (root + 4 alive).
// Every budget gives bitwise the same parameters (prefetch changes timing, not math).
TESSERA_WORKER(fsdp_prefetch) {
  auto ctx = initWorker(w);
  Setup s;
  s.layers = 4;
  size_t root = 0, block = 0;
  FsdpStats none, two, all;
  FsdpOptions o;
  auto ref = trainAndGather(s, o, ctx, w.rank, &none, &root, &block);
  o.prefetchBudgetBytes = root + 2 * block;
  auto got2 = trainAndGather(s, o, ctx, w.rank, &two, nullptr, nullptr);
  o.prefetchBudgetBytes = size_t(1) << 40;
  auto gotAll = trainAndGather(s, o, ctx, w.rank, &all, nullptr, nullptr);
  fmt::print("rank {}: root {} B, block {} B; peak units/bytes/prefetches: budget 0 {}/{}/{}, root+2 blocks {}/{}/{}, "
             "unlimited {}/{}/{}\n",
             w.rank, root, block, none.peakUnshardedUnits, none.peakUnshardedBytes, none.prefetches,
             two.peakUnshardedUnits, two.peakUnshardedBytes, two.prefetches, all.peakUnshardedUnits,
             all.peakUnshardedBytes, all.prefetches);
  WCHECK(none.prefetches == 0 && none.peakUnshardedUnits == 2 && none.peakUnshardedBytes == root + block,
         "budget 0: {} prefetches, peak {} units", none.prefetches, none.peakUnshardedUnits);
  WCHECK(two.peakUnshardedBytes <= root + 2 * block && two.peakUnshardedUnits == 3 && two.prefetches > 0,
         "budget root+2 blocks: peak {} B ({} units), {} prefetches", two.peakUnshardedBytes, two.peakUnshardedUnits,
         two.prefetches);
  WCHECK(all.peakUnshardedUnits > two.peakUnshardedUnits && all.peakUnshardedUnits == 5,
         "unlimited budget prefetched no deeper ({} units, {} prefetches)", all.peakUnshardedUnits, all.prefetches);
  // Same number of all-gathers: prefetching only moves them earlier.
  WCHECK(none.allGathers == two.allGathers && two.allGathers == all.allGathers, "all-gathers {} / {} / {}",
         none.allGathers, two.allGathers, all.allGathers);
  for (auto& [k, v] : ref) WCHECK(v.equal(got2[k]) && v.equal(gotAll[k]), "'{}' depends on the budget", k);
}

TEST(Fsdp, PrefetchDepthFollowsTheMemoryBudget) {
  expectAllOk(runWorkers("fsdp_prefetch", {.ranks = 2, .timeout = std::chrono::seconds(120)}));
}

// Sharded (parameters + optimizer) and full state dicts: save after 2 steps, load into FSDP
// objects built from other initial values, continue: bitwise the same as never stopping
// (the uninterrupted run also does an evaluation forward without backward in between).
TESSERA_WORKER(fsdp_state_dict) {
  auto ctx = initWorker(w);
  Setup s;
  FsdpOptions o;
  auto a = makeTask(s, 100);
  FullyShardedDataParallel fa(a.units, ctx.world, o);
  ShardedAdamW oa(fa, {.lr = 1e-3});
  for (int step = 0; step < 2; ++step) fsdpStep(fa, oa, a, step, 1, w.rank, 0);
  auto sharded = fa.shardedStateDict();
  auto optState = oa.stateDict();
  auto full = fa.fullStateDict();
  {  // an evaluation forward in between (no backward) changes nothing once resharded
    torch::NoGradGuard ng;
    auto evalLoss = fsdpLoss(fa, a, 99, 0, w.rank);
    WCHECK(std::isfinite(evalLoss.item<double>()), "eval loss {}", evalLoss.item<double>());
    fa.reshardAll();
    WCHECK(fa.stats().unshardedUnits == 0, "{} units unsharded after reshardAll", fa.stats().unshardedUnits);
  }
  for (int step = 2; step < 5; ++step) fsdpStep(fa, oa, a, step, 1, w.rank, 0);
  auto finalA = fa.fullStateDict();

  auto b = makeTask(s, 200);
  FullyShardedDataParallel fb(b.units, ctx.world, o);
  ShardedAdamW ob(fb, {.lr = 1e-3});
  fb.loadShardedStateDict(sharded);
  ob.loadStateDict(optState);
  WCHECK(ob.steps() == 2, "optimizer step {} after load", ob.steps());
  for (int step = 2; step < 5; ++step) fsdpStep(fb, ob, b, step, 1, w.rank, 0);
  auto finalB = fb.fullStateDict();

  auto c = makeTask(s, 300);
  FullyShardedDataParallel fc(c.units, ctx.world, o);
  fc.loadFullStateDict(full);
  auto back = fc.fullStateDict();
  if (w.rank == 0) {
    WCHECK(full.size() == namedParameters(*a.module).size(), "full state dict has {} entries", full.size());
    for (auto& [k, v] : finalA) WCHECK(v.equal(finalB.at(k)), "'{}' differs after the sharded round trip", k);
    for (auto& [k, v] : full) WCHECK(v.equal(back.at(k)), "'{}' differs after the full round trip", k);
    WCHECK(!finalA.begin()->second.equal(full.at(finalA.begin()->first)), "training did not change '{}'",
           finalA.begin()->first);
  }
  // A sharded checkpoint of another sharding is refused with the key named.
  auto bad = sharded;
  bad["root.layout"] = at::tensor(std::vector<int64_t>{1, 2, 3, 4}, at::kLong);
  expectErrorContaining([&] { fb.loadShardedStateDict(bad); }, {"root.layout", "same sharding"});
  auto missing = sharded;
  missing.erase("blocks.1.flat_shard");
  expectErrorContaining([&] { fb.loadShardedStateDict(missing); }, {"missing key 'blocks.1.flat_shard'"});
}

TEST(Fsdp, StateDictRoundTrips) {
  expectAllOk(runWorkers("fsdp_state_dict", {.ranks = 2, .timeout = std::chrono::seconds(120)}));
}

// A unit whose forward skips some of its parameters (fc2 inside unit "fc1+fc2"): that unit's
// gradients are incomplete until the end of backward, where they are reduce-scattered with
// zeros for fc2; the gradient shards, gathered, equal the single-process gradient.
TESSERA_WORKER(fsdp_unused) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(5);
  m->skipFc2 = true;
  std::vector<FsdpUnitSpec> units = {
      {"fc1+fc2", {{"fc1.weight", m->fc1->weight}, {"fc1.bias", m->fc1->bias}, {"fc2.weight", m->fc2->weight},
                   {"fc2.bias", m->fc2->bias}}},
      {"fc3", {{"fc3.weight", m->fc3->weight}, {"fc3.bias", m->fc3->bias}}}};
  FullyShardedDataParallel f(units, ctx.world);
  auto b = mlpBatch(7, w.rank, 4);
  auto h = f.runUnit(0, b.x, [&](const at::Tensor& x) { return torch::relu(m->fc1->forward(x)); });
  mlpLoss(f.runUnit(1, h, [&](const at::Tensor& x) { return m->fc3->forward(x); }), b.y).backward();

  auto ref = makeTinyMlp(5);
  ref->skipFc2 = true;
  auto rb = concatMlpBatches(7, w.world, 4);
  mlpLoss(ref->forward(rb.x), rb.y).backward();
  auto refParams = ref->named_parameters();
  for (size_t u = 0; u < f.numUnits(); ++u) {
    const auto& l = f.layout(u);
    auto full = at::empty({l.paddedNumel}, at::kFloat);
    ctx.world->allGather(full, f.gradShard(u))->synchronize();
    for (const auto& e : l.entries) {
      auto g = full.narrow(0, e.offset, e.numel).view(e.shape);
      auto want = refParams[e.name].grad();
      if (!want.defined()) want = at::zeros_like(g);
      const double d = (g - want).abs().max().item<double>();
      WCHECK(d < 1e-6, "gradient of '{}' differs by {}", e.name, d);
    }
  }
  WCHECK(f.stats().unshardedUnits == 0, "{} units left unsharded", f.stats().unshardedUnits);
}

TEST(Fsdp, UnitWithUnusedParametersReducesAtTheEndOfBackward) {
  expectAllOk(runWorkers("fsdp_unused", {.ranks = 2, .timeout = std::chrono::seconds(60)}));
}

// clipGradNorm against the gathered gradient (2 ranks): the norm comes back as a 0-dim fp32
// tensor on the shards' device, equal to the L2 norm of the full gradient computed in double from
// the gathered shards (rtol 1e-5: fp32 sums of ~30k squares in another order, each rounding
// 2^-24 relative); below maxNorm the shards are left bitwise unchanged (multiplied by exactly 1);
// above it they are scaled to norm maxNorm (rtol 1e-5 again).
TESSERA_WORKER(fsdp_clip) {
  auto ctx = initWorker(w);
  auto task = makeTask(Setup{}, 100);
  FullyShardedDataParallel fsdp(task.units, ctx.world, {});
  fsdpLoss(fsdp, task, 0, 0, w.rank).backward();
  auto gradsAndNorm = [&] {
    std::vector<at::Tensor> shards;
    double sq = 0;
    for (size_t u = 0; u < fsdp.numUnits(); ++u) {
      const auto& l = fsdp.layout(u);
      shards.push_back(fsdp.gradShard(u).clone());
      auto full = at::empty({l.paddedNumel}, at::kFloat);
      ctx.world->allGather(full, fsdp.gradShard(u))->synchronize();
      sq += full.narrow(0, 0, l.trainableNumel).to(at::kDouble).pow(2).sum().item<double>();
    }
    return std::make_pair(shards, std::sqrt(sq));
  };
  auto [before, want] = gradsAndNorm();
  auto norm = fsdp.clipGradNorm(1e9);
  WCHECK(norm.dim() == 0 && norm.scalar_type() == at::kFloat && norm.device() == fsdp.masterShard(0).device(),
         "norm is a {}-dim {} tensor on {}", norm.dim(), dtypeName(norm.scalar_type()), norm.device().str());
  WCHECK(std::abs(norm.item<double>() - want) <= 1e-5 * want, "norm {} vs {} from the gathered gradient",
         norm.item<double>(), want);
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    WCHECK(fsdp.gradShard(u).equal(before[u]), "unit {}: gradient changed although its norm {} < maxNorm", u, want);
  }
  const double maxNorm = want / 4;
  auto again = fsdp.clipGradNorm(maxNorm);
  WCHECK(again.equal(norm), "the norm before clipping changed: {} vs {}", again.item<double>(), norm.item<double>());
  auto [after, clipped] = gradsAndNorm();
  WCHECK(std::abs(clipped - maxNorm) <= 1e-5 * maxNorm, "clipped norm {} vs maxNorm {}", clipped, maxNorm);
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const double d = (after[u] - before[u] * (maxNorm / want)).abs().max().item<double>();
    WCHECK(d <= 1e-5 * before[u].abs().max().item<double>(), "unit {}: not a uniform scaling (off by {})", u, d);
  }
}

TEST(Fsdp, ClipGradNormReturnsTheNormAndScalesOnlyAboveMaxNorm) {
  expectAllOk(runWorkers("fsdp_clip", {.ranks = 2, .timeout = std::chrono::seconds(60)}));
}

// A unit run twice in one forward while resharding after forward (a root without
// reshardAfterForward = false) is warned about once. Not warned: a pipeline's micro-batch
// forwards before their backwards (every block unit run twice, the root, not resharding, four
// times), and one unit's forwards of two micro-batches before the next unit's first (as
// interleaved pipeline stages run them). 1 rank: the warning is local.
TESSERA_WORKER(fsdp_rerun_warning) {
  auto ctx = initWorker(w);
  Setup s;
  {
    auto task = makeTask(s, 100);  // root: reshardAfterForward false
    FullyShardedDataParallel fsdp(task.units, ctx.world, {});
    ShardedAdamW opt(fsdp);
    fsdpStep(fsdp, opt, task, 0, 2, w.rank, 0, /*pipelined=*/true);
    fsdpStep(fsdp, opt, task, 1, 1, w.rank, 0);
  }
  {
    auto m = makeTinyMlp(6);
    FullyShardedDataParallel f({{"fc1", {{"fc1.weight", m->fc1->weight}, {"fc1.bias", m->fc1->bias}}},
                                {"fc2", {{"fc2.weight", m->fc2->weight}, {"fc2.bias", m->fc2->bias}}}},
                               ctx.world);
    auto run = [&](size_t u, const at::Tensor& x) {
      return f.runUnit(u, x, [&](const at::Tensor& t) { return u == 0 ? m->fc1->forward(t) : m->fc2->forward(t); });
    };
    auto x = at::randn({2, 8});
    auto h0 = run(0, x), h1 = run(0, 2 * x);
    {
      auto guard = f.noSync();
      run(1, h0).sum().backward();
    }
    run(1, h1).sum().backward();
  }
  fmt::print("---- root resharding after forward\n");
  std::fflush(stdout);
  auto task = makeTask(s, 100);
  task.units[0].reshardAfterForward = std::nullopt;  // the default: true
  FullyShardedDataParallel fsdp(task.units, ctx.world, {});
  ShardedAdamW opt(fsdp);
  for (int step = 0; step < 2; ++step) fsdpStep(fsdp, opt, task, step, 1, w.rank, 0);
  // The cost the warning names: the root gathered twice per forward, 4 all-gathers a forward.
  fsdp.resetStats();
  torch::NoGradGuard ng;
  fsdpLoss(fsdp, task, 2, 0, w.rank);
  fsdp.reshardAll();
  WCHECK(fsdp.stats().allGathers == 4, "{} all-gathers in a forward of 3 units with the root run twice",
         fsdp.stats().allGathers);
}

TEST(Fsdp, UnitRunTwiceWhileReshardingIsWarnedOnce) {
  auto res = runWorkers("fsdp_rerun_warning", {.ranks = 1, .timeout = std::chrono::seconds(60)});
  expectAllOk(res);
  ASSERT_EQ(res.size(), 1u);
  const std::string& out = res[0].output;
  const auto mark = out.find("---- root resharding after forward");
  ASSERT_NE(mark, std::string::npos) << out;
  auto count = [&](size_t from, size_t to, const std::string& what) {
    int n = 0;
    for (size_t at = out.find(what, from); at != std::string::npos && at < to; at = out.find(what, at + 1)) ++n;
    return n;
  };
  const std::string warning = "with reshardAfterForward true";
  EXPECT_EQ(count(0, mark, warning), 0) << "warned without a repeated resharding unit:\n" << out;
  EXPECT_EQ(count(mark, out.size(), warning), 1) << out;
  EXPECT_EQ(count(mark, out.size(), "unit 0 ('root') ran 2 times in the forward this backward went through"), 1)
      << out;
}
