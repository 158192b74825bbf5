// DistributedDataParallel: the clear errors (mismatched models, unused parameters without
// findUnusedParameters, bad options) and bucket rebuild from the observed ready order.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"

using namespace tessera;
using namespace tessera::testing;

TESSERA_WORKER(ddp_mismatch) {
  auto ctx = initWorker(w);
  TinyMlpOptions o;
  if (w.rank == 1) o.hidden = 33;  // rank 1's fc1.weight is [33, 8]
  auto m = makeTinyMlp(1, o);
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world); },
                        {"parameters differ", "#0", "rank 0 has 'fc1.weight' [32, 8] float32",
                         "rank 1 has 'fc1.weight' [33, 8] float32"});
}

TEST(Ddp, MismatchedModelsNameTheParameterAndRanks) { expectAllOk(runWorkers("ddp_mismatch", {.ranks = 3})); }

TESSERA_WORKER(ddp_extra_param) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  auto named = namedParameters(*m);
  if (w.rank == 0) named.emplace_back("extra", at::zeros({2}).requires_grad_());
  expectErrorContaining([&] { DistributedDataParallel ddp(named, {}, ctx.world); },
                        {"count per rank: 7, 6", "#6", "rank 0 has 'extra' [2] float32", "rank 1 has (none)"});
}

TEST(Ddp, ExtraParameterOnOneRankIsNamed) { expectAllOk(runWorkers("ddp_extra_param", {.ranks = 2})); }

TESSERA_WORKER(ddp_unused_error) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  m->skipFc2 = true;
  DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world);
  auto b = mlpBatch(0, w.rank, 4);
  expectErrorContaining([&] { mlpLoss(m->forward(b.x), b.y).backward(); },
                        {"got no gradient", "fc2.weight", "fc2.bias", "findUnusedParameters",
                         fmt::format("rank {}", w.rank).c_str()});
}

TEST(Ddp, UnusedParameterWithoutOptionIsAClearError) { expectAllOk(runWorkers("ddp_unused_error", {.ranks = 2})); }

TESSERA_WORKER(ddp_bad_options) {
  auto ctx = initWorker(w);
  auto m = makeTinyMlp(1);
  DdpOptions o;
  o.gradientAsBucketView = true;
  o.commDtype = at::kBFloat16;
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o); },
                        {"gradientAsBucketView", "float32", "bfloat16"});
  o = DdpOptions{};
  o.commDtype = at::kInt;
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o); },
                        {"commDtype int32"});
  o = DdpOptions{};
  o.smCarveout = -4;
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o); },
                        {"smCarveout -4 is negative"});
  o = DdpOptions{};
  o.findUnusedParameters = true;
  o.onBucketReduced = [](const std::vector<at::Tensor>&) {};
  expectErrorContaining([&] { DistributedDataParallel ddp(namedParameters(*m), {}, ctx.world, o); },
                        {"onBucketReduced", "findUnusedParameters"});
}

TEST(Ddp, ContradictoryOptionsAreRejected) { expectAllOk(runWorkers("ddp_bad_options", {.ranks = 2})); }

namespace {
// Registered a, b, c but applied c first: gradients become ready a, b, c — the reverse of
// registration order reversed (c, b, a), which is where buckets start.
struct ReorderNetImpl : torch::nn::Module {
  ReorderNetImpl() {
    a = register_module("a", torch::nn::Linear(6, 6));
    b = register_module("b", torch::nn::Linear(6, 6));
    c = register_module("c", torch::nn::Linear(6, 6));
  }
  at::Tensor forward(const at::Tensor& x) { return a(torch::tanh(b(torch::tanh(c(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(ReorderNet);

std::string firstLayer(const std::vector<std::vector<std::string>>& layout) { return layout.front().front().substr(0, 1); }
}  // namespace

TESSERA_WORKER(ddp_rebuild) {
  auto ctx = initWorker(w);
  torch::manual_seed(3);
  ReorderNet net;
  DdpOptions o;
  o.bucketCapBytes = o.firstBucketCapBytes = 1;  // one tensor per bucket
  DistributedDataParallel ddp(namedParameters(*net), {}, ctx.world, o);
  auto before = ddp.bucketLayout();
  WCHECK(before.size() == 6 && firstLayer(before) == "c", "initial layout starts with {}", before.front().front());
  torch::optim::SGD opt(net->parameters(), 0.1);
  torch::manual_seed(10 + w.rank);
  for (int step = 0; step < 3; ++step) {
    ddp.zeroGrad();
    auto x = torch::randn({5, 6});
    net->forward(x).pow(2).mean().backward();
    opt.step();
    auto layout = ddp.bucketLayout();
    // After the first backward the buckets follow the ready order: a first, c last.
    WCHECK(layout.size() == 6 && firstLayer(layout) == "a" && layout.back().front().substr(0, 1) == "c",
           "step {}: layout starts with {} and ends with {}", step, layout.front().front(), layout.back().front());
  }
  // Still in sync after the rebuild.
  std::vector<at::Tensor> v;
  for (auto& p : net->parameters()) v.push_back(p.detach().reshape({-1}));
  auto mine = at::cat(v);
  auto all = at::empty({w.world * mine.numel()});
  ctx.world->allGather(all, mine)->synchronize();
  WCHECK(all.view({w.world, -1})[1].equal(mine), "ranks differ after bucket rebuild");
}

TEST(Ddp, BucketsRebuiltInReadyOrder) { expectAllOk(runWorkers("ddp_rebuild", {.ranks = 2})); }

// reduceGradients after backwards under noSync (a zero-bubble pipeline's way): every .grad is
// the average of the ranks' local ones, with and without bucket views, and DDP's own
// synchronised backward still works afterwards.
TESSERA_WORKER(ddp_reduce_gradients) {
  auto ctx = initWorker(w);
  for (bool views : {false, true}) {
    torch::manual_seed(3);
    ReorderNet net;
    DdpOptions o;
    o.gradientAsBucketView = views;
    o.firstBucketCapBytes = 64;  // several buckets
    DistributedDataParallel ddp(namedParameters(*net), {}, ctx.world, o);
    for (int step = 0; step < 2; ++step) {
      ddp.zeroGrad();
      torch::manual_seed(100 * step + w.rank);
      {
        auto guard = ddp.noSync();
        for (int m = 0; m < 2; ++m) net->forward(torch::randn({5, 6})).pow(2).mean().backward();
      }
      std::vector<at::Tensor> local;
      for (auto& p : net->parameters()) local.push_back(p.grad().clone());
      ddp.reduceGradients();
      size_t i = 0;
      for (auto& p : net->parameters()) {
        auto sum = local[i].clone();
        ctx.world->allReduce(sum, ReduceOp::Sum)->synchronize();
        WCHECK(at::allclose(p.grad(), sum / w.world, 1e-6, 1e-7), "views {} step {} param {}: not the average", views,
               step, i);
        ++i;
      }
    }
    // A synchronised backward afterwards averages as usual.
    ddp.zeroGrad();
    torch::manual_seed(7 + w.rank);
    net->forward(torch::randn({5, 6})).pow(2).mean().backward();
    for (auto& p : net->parameters()) {
      auto mine = p.grad().clone(), other = p.grad().clone();
      ctx.world->broadcast(other, 0)->synchronize();
      WCHECK(mine.equal(other), "views {}: ranks differ after a synchronised backward", views);
    }
  }
}

TEST(Ddp, ReduceGradientsAveragesWhatNoSyncAccumulated) {
  expectAllOk(runWorkers("ddp_reduce_gradients", {.ranks = 2}));
}
