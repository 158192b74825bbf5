// FullyShardedDataParallel's refusals on Gloo: each error names what is wrong (the unit, the
// parameter, the shape, the call); a tensor listed twice in one unit is accepted once.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"
#include "parallel/data_parallel/fsdp/fsdp_task.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

using namespace tessera;
using namespace tessera::testing;

// Bad input: each error names what is wrong (all checks here are local, so 1 rank); a tensor
// listed twice in one unit is accepted once.
TESSERA_WORKER(fsdp_errors) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  auto P = [&](const char* n) { return std::make_pair(std::string(n), m->named_parameters()[n]); };
  expectErrorContaining(
      [&] {
        FullyShardedDataParallel f({{"a", {P("fc1.weight"), P("fc1.bias")}}, {"b", {{"tied", m->fc1->weight}}}},
                                   ctx.world);
      },
      {"'tied' of unit 'b'", "'fc1.weight' of unit 'a'", "shared across units"});
  expectErrorContaining([&] { FullyShardedDataParallel f({{"a", {P("fc1.weight")}}, {"b", {}}}, ctx.world); },
                        {"unit 1 ('b') has no parameters"});
  expectErrorContaining([&] { FullyShardedDataParallel f({}, ctx.world); }, {"no units"});
  expectErrorContaining(
      [&] { FullyShardedDataParallel f({{"a", {P("fc1.weight")}}, {"b", {{"fc1.weight", m->fc2->weight}}}}, ctx.world); },
      {"parameter name 'fc1.weight'", "unit 'a'", "unit 'b'"});
  FsdpOptions o;
  o.paramDtype = at::kInt;
  expectErrorContaining([&] { FullyShardedDataParallel f({{"a", {P("fc1.weight")}}}, ctx.world, o); },
                        {"paramDtype int32"});
  o = {};
  o.gatherEmbeddingRows = true;  // gathered ids travel as float32: a table of 2^24 + 1 rows is refused
  auto huge = at::zeros({(int64_t{1} << 24) + 1, 1}).requires_grad_(true);
  expectErrorContaining([&] { FullyShardedDataParallel f({{"emb", {{"table", huge}}}}, ctx.world, o); },
                        {"gatherEmbeddingRows", "'table' of unit 'emb' has 16777217 rows", "exact below 2^24"});
  o = {};
  o.shardGroupSize = 3;
  expectErrorContaining([&] { FullyShardedDataParallel f({{"a", {P("fc1.weight")}}}, ctx.world, o); },
                        {"shardGroupSize 3 does not divide the world size 1"});

  {  // the same tensor twice in one unit (tied weights inside a unit) is kept once
    auto m3 = makeTinyMlp(3);
    FullyShardedDataParallel f({{"a", {{"w", m3->fc1->weight}, {"b", m3->fc1->bias}, {"tied", m3->fc1->weight}}}},
                               ctx.world);
    WCHECK(f.layout(0).entries.size() == 2 && f.layout(0).numel == 32 * 8 + 32, "tied weight counted twice");
  }
  auto m2 = makeTinyMlp(2);
  FullyShardedDataParallel f({{"fc1", {{"fc1.weight", m2->fc1->weight}, {"fc1.bias", m2->fc1->bias}}},
                              {"fc2", {{"fc2.weight", m2->fc2->weight}, {"fc2.bias", m2->fc2->bias}}}},
                             ctx.world);
  auto x = at::randn({2, 8});
  expectErrorContaining([&] { f.runUnit(5, x, [](const at::Tensor& t) { return t; }); },
                        {"unit 5 out of range", "2 units"});
  expectErrorContaining(
      [&] {
        f.runUnit(0, x, [&](const at::Tensor& t) {
          return f.runUnit(1, m2->fc1->forward(t), [&](const at::Tensor& h) { return m2->fc2->forward(h); });
        });
      },
      {"unit 1 ('fc2') started while unit 0 ('fc1') runs"});
  f.reshardAll();
  {  // Nesting inside a unit that stays gathered (reshardAfterForward false, a root) works;
     // a unit inside itself does not. Released gradient shards read as zeros.
    auto m4 = makeTinyMlp(4);
    FullyShardedDataParallel g({{"root", {{"fc1.weight", m4->fc1->weight}, {"fc1.bias", m4->fc1->bias}}, false, {}},
                                {"fc2", {{"fc2.weight", m4->fc2->weight}, {"fc2.bias", m4->fc2->bias}}, {}, {}}},
                               ctx.world);
    auto y = g.runUnit(0, x, [&](const at::Tensor& t) {
      return g.runUnit(1, m4->fc1->forward(t), [&](const at::Tensor& h) { return m4->fc2->forward(h); });
    });
    y.sum().backward();
    WCHECK(g.gradShard(0).abs().sum().item<double>() > 0 && g.gradShard(1).abs().sum().item<double>() > 0,
           "nested units got no gradient");
    g.zeroGrad();
    WCHECK(g.gradShard(1).numel() == g.layout(1).shardNumel && g.gradShard(1).abs().sum().item<double>() == 0,
           "gradShard after zeroGrad is not zeros of the shard's size");
    expectErrorContaining(
        [&] {
          g.runUnit(0, x, [&](const at::Tensor& t) { return g.runUnit(0, t, [](const at::Tensor& v) { return v; }); });
        },
        {"unit 0 ('root') started inside itself"});
    g.reshardAll();
  }
  // A unit's forward using another (sharded) unit's parameter: a tessera error naming both,
  // not ATen's words about storage.
  expectErrorContaining([&] { f.runUnit(1, x, [&](const at::Tensor& t) { return m2->fc1->forward(t); }); },
                        {"the forward of unit 1 ('fc2')", "sharded now ('fc1')", "only its own parameters"});
  f.reshardAll();
  // Loads are refused while a unit is gathered or a forward's backward is pending; fine after.
  const auto saved = f.shardedStateDict();
  f.unshardAll();
  expectErrorContaining([&] { f.loadShardedStateDict(saved); },
                        {"loadShardedStateDict", "unit 0 ('fc1') is gathered", "reshardAll"});
  expectErrorContaining([&] { f.loadFullStateDict({}); }, {"loadFullStateDict", "unit 0 ('fc1') is gathered"});
  f.reshardAll();
  auto pending = f.runUnit(0, x, [&](const at::Tensor& t) { return m2->fc1->forward(t); });
  expectErrorContaining([&] { f.loadShardedStateDict(saved); },
                        {"loadShardedStateDict", "inside a forward/backward pass"});
  pending.sum().backward();
  f.loadShardedStateDict(saved);
  expectErrorContaining([&] { f.clipGradNorm(-1); }, {"clipGradNorm", "maxNorm -1 must be >= 0"});
  {  // KeepGathered: one scope at a time; no optimizer step inside it (stale gathered units); its
     // end reshards what it kept.
    ShardedAdamW opt(f, {});
    auto keep = f.keepGathered();
    expectErrorContaining([&] { auto second = f.keepGathered(); }, {"keepGathered", "open already"});
    f.runUnit(0, x, [&](const at::Tensor& t) { return m2->fc1->forward(t); }).sum().backward();
    WCHECK(f.stats().unshardedUnits == 1, "KeepGathered: {} units gathered after a forward and backward of one",
           f.stats().unshardedUnits);
    expectErrorContaining([&] { opt.step(); }, {"ShardedAdamW::step", "KeepGathered", "end the scope"});
  }
  WCHECK(f.stats().unshardedUnits == 0 && !f.keepingGathered(), "KeepGathered's end left {} units gathered",
         f.stats().unshardedUnits);
  std::map<std::string, at::Tensor> sd{{"fc1.weight", at::zeros({32, 8})}, {"fc1.bias", at::zeros({3})}};
  expectErrorContaining([&] { f.loadFullStateDict(sd); }, {"'fc1.bias' has shape 3", "the parameter has 32"});
  sd.erase("fc1.bias");
  expectErrorContaining([&] { f.loadFullStateDict(sd); }, {"no entry for parameter 'fc1.bias' of unit 'fc1'"});
}

TEST(Fsdp, BadInputIsAClearError) { expectAllOk(runWorkers("fsdp_errors", {.ranks = 1})); }
