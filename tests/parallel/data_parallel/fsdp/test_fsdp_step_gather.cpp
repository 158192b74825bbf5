// FsdpOptions::gatherAfterStep on Gloo: ShardedAdamW::step updates the units the next forward starts
// with first and all-gathers them while it updates the rest. Training gives bitwise the parameters
// it gives without; the leading units stay gathered after each step and nothing else; a state-dict
// load after a step reshards them first; asking inside a pass is a clear error.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"
#include "parallel/data_parallel/fsdp/fsdp_task.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

struct Run {
  std::map<std::string, at::Tensor> params;  // full state dict after the steps (rank 0)
  FsdpStats stats;                           // after the last step
  std::vector<int> lead;                     // leadingUnits() after the last step
};

Run train(const Setup& s, FsdpOptions o, const Context& ctx, int rank, bool reloadAfterStep) {
  auto task = makeTask(s, 100);
  FullyShardedDataParallel fsdp(task.units, ctx.world, o);
  ShardedAdamW opt(fsdp, {.lr = 1e-3});
  Run r;
  for (int step = 0; step < 3; ++step) fsdpStep(fsdp, opt, task, step, 1, rank, 0.5);
  r.stats = fsdp.stats();
  r.lead = fsdp.leadingUnits();
  if (reloadAfterStep) {
    // Units gathered ahead would keep the old values: the load releases them first.
    auto sd = fsdp.shardedStateDict();
    fsdp.loadShardedStateDict(sd);
    WCHECK(fsdp.stats().unshardedUnits == 0, "{} units still gathered after a load", fsdp.stats().unshardedUnits);
    fsdpStep(fsdp, opt, task, 3, 1, rank, 0.5);
  }
  r.params = fsdp.fullStateDict();
  return r;
}

}  // namespace

TESSERA_WORKER(fsdp_gather_after_step) {
  auto ctx = initWorker(w);
  Setup s;
  s.layers = 4;
  FsdpOptions o;
  size_t root = 0, block = 0;
  {
    auto task = makeTask(s, 100);
    FullyShardedDataParallel probe(task.units, ctx.world, o);
    root = probe.layout(0).paddedNumel * c10::elementSize(o.paramDtype);
    block = probe.layout(1).paddedNumel * c10::elementSize(o.paramDtype);
  }
  o.prefetchBudgetBytes = root + 2 * block;
  auto off = train(s, o, ctx, w.rank, false);
  o.gatherAfterStep = true;
  auto on = train(s, o, ctx, w.rank, false);
  // Between steps, the next forward starts with the root and gathers ahead of it what the budget
  // holds beside it: two blocks.
  WCHECK(off.lead == std::vector<int>({0, 1, 2}), "leading units {}", fmt::join(off.lead, ","));
  WCHECK(off.stats.unshardedUnits == 0, "without gatherAfterStep {} units gathered after the step",
         off.stats.unshardedUnits);
  WCHECK(on.stats.unshardedUnits == 3 && on.stats.unshardedBytes == root + 2 * block,
         "after the step {} units ({} B) gathered, expected the 3 leading ones", on.stats.unshardedUnits,
         on.stats.unshardedBytes);
  // The gathers move from the next forward to the step: the same count, plus the last step's three.
  WCHECK(on.stats.allGathers == off.stats.allGathers + 3, "all-gathers {} with, {} without", on.stats.allGathers,
         off.stats.allGathers);
  for (auto& [k, v] : off.params) WCHECK(v.equal(on.params.at(k)), "'{}' differs with gatherAfterStep", k);

  // A load after a step, then one more step: as without gatherAfterStep.
  auto onReload = train(s, o, ctx, w.rank, true);
  o.gatherAfterStep = false;
  auto offReload = train(s, o, ctx, w.rank, true);
  for (auto& [k, v] : offReload.params) WCHECK(v.equal(onReload.params.at(k)), "'{}' differs after the reload", k);
  WCHECK(!offReload.params.empty() || w.rank != 0, "no parameters on rank 0");

  // Inside a pass (a forward whose backward has not run) the gather is refused.
  o.gatherAfterStep = true;
  auto task = makeTask(s, 100);
  FullyShardedDataParallel fsdp(task.units, ctx.world, o);
  auto loss = fsdpLoss(fsdp, task, 0, 0, w.rank);
  expectErrorContaining([&] { fsdp.gatherForNextForward({0}); }, {"gatherForNextForward", "inside a forward"});
  loss.backward();
}

TEST(Fsdp, GatherAfterStepChangesTimingNotMath) {
  expectAllOk(runWorkers("fsdp_gather_after_step", {.ranks = 2, .timeout = std::chrono::seconds(120)}));
}
