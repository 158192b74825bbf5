// DistributedDataParallel with gatherEmbeddingRows and a tied table (the train_gpt layout without a
// pipeline): an untracked embedding lookup (nn/accum_embedding.h) and a head sharing the table, a
// hidden layer between, on 2 and 3 ranks over Gloo with different data each, SGD for 4 steps against
// the single-process run of every rank's data (plain autograd: at::embedding, at::linear). The
// table's gradient-ready hook must fire before the lookup's backward runs (its bucket leaves with the
// head's gradient), the rows must be gathered in the synchronised backward and summed locally under
// noSync, stale gradients may hold NaN, and the options that cannot go together are refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/optim/sgd.h>

#include <limits>

#include "harness/args.h"
#include "harness/multiprocess.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

constexpr int64_t kVocab = 37, kDim = 8, kTokens = 6;

// Identity whose backward notes whether the table's gradient hook had fired by then: it runs
// right before the lookup's backward.
struct Marker : torch::autograd::Function<Marker> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, bool* seen, const bool* fired) {
    seenSlot() = seen, firedSlot() = fired;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    *seenSlot() = *firedSlot();
    return {g[0], at::Tensor(), at::Tensor()};
  }
  static bool*& seenSlot() {
    static bool* s = nullptr;
    return s;
  }
  static const bool*& firedSlot() {
    static const bool* f = nullptr;
    return f;
  }
};

struct Batch {
  at::Tensor ids, targets;
};
Batch batchOf(int step, int micro, int rank) {
  auto g = at::detail::createCPUGenerator(1000 * step + 10 * micro + rank);
  return {at::randint(0, kVocab, {kTokens}, g, at::kLong), at::randint(0, kVocab, {kTokens}, g, at::kLong)};
}

at::Tensor tiedLoss(const at::Tensor& table, const at::Tensor& hidden, const Batch& b, bool fused, bool* seen,
                    const bool* fired) {
  at::Tensor x = fused ? nn::embeddingAccumulateGrad(b.ids, table, /*untracked=*/true) : at::embedding(table, b.ids);
  if (seen) x = Marker::apply(x, seen, fired);
  auto h = at::tanh(fused ? nn::linearAccumulateGrad(x, hidden) : at::linear(x, hidden));
  auto logits = fused ? nn::linearAccumulateGrad(h, table) : at::linear(h, table);
  return at::cross_entropy_loss(logits, b.targets);
}

}  // namespace

// arg: "accum=<k>;stale=0|1;view=0|1"
TESSERA_WORKER(ddp_tied_rows) {
  auto a = parseArgs(w.arg);
  const int accum = a.count("accum") ? std::stoi(a["accum"]) : 1;
  auto ctx = initWorker(w);
  torch::manual_seed(21);
  const auto table0 = at::randn({kVocab, kDim}) * 0.3, hidden0 = at::randn({kDim, kDim}) * 0.3;
  auto table = table0.clone().requires_grad_(true), hidden = hidden0.clone().requires_grad_(true);
  DdpOptions o;
  o.gatherEmbeddingRows = true;
  o.overwriteStaleGrads = a.count("stale") && a["stale"] == "1";
  o.gradientAsBucketView = a.count("view") && a["view"] == "1";
  DistributedDataParallel ddp({{"table", table}, {"hidden", hidden}}, {}, ctx.world, o);
  bool fired = false, seenFired = false;
  auto acc = torch::autograd::impl::grad_accumulator(table);
  acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [&fired](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
        fired = true;
        return out;
      }));
  torch::optim::SGD opt({table, hidden}, torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 4; ++step) {
    ddp.zeroGrad();
    if (o.overwriteStaleGrads) {
      for (auto* p : {&table, &hidden})
        if (p->grad().defined()) p->mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
    }
    for (int k = 0; k < accum; ++k) {
      fired = false, seenFired = false;
      auto loss = tiedLoss(table, hidden, batchOf(step, k, w.rank), true, &seenFired, &fired) / accum;
      if (k + 1 < accum) {
        auto guard = ddp.noSync();
        loss.backward();
      } else {
        loss.backward();
        WCHECK(seenFired, "step {}: the table's gradient hook had not fired when the lookup's backward ran", step);
      }
    }
    opt.step();
  }
  // The single process: every rank's micro-batches, plain autograd.
  auto refTable = table0.clone().requires_grad_(true), refHidden = hidden0.clone().requires_grad_(true);
  torch::optim::SGD refOpt({refTable, refHidden}, torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 4; ++step) {
    refOpt.zero_grad();
    at::Tensor loss = at::zeros({});
    for (int r = 0; r < w.world; ++r)
      for (int k = 0; k < accum; ++k)
        loss = loss + tiedLoss(refTable, refHidden, batchOf(step, k, r), false, nullptr, nullptr);
    (loss / (w.world * accum)).backward();
    refOpt.step();
  }
  const double dt = (table - refTable).abs().max().item<double>(), dh = (hidden - refHidden).abs().max().item<double>();
  const double moved = (refTable - table0).abs().max().item<double>();
  WCHECK(moved > 1e-2, "training barely moved the table ({})", moved);
  WCHECK(dt < 1e-5 && dh < 1e-5, "parameters differ from the single process: table {}, hidden {}", dt, dh);
}

TEST(DdpTied, GatheredRowsMatchTheSingleProcess) {
  for (const char* arg : {"accum=1", "accum=2;stale=1;view=1", "accum=3;view=1"}) {
    for (int ranks : {2, 3}) expectAllOk(runWorkers("ddp_tied_rows", {.ranks = ranks, .arg = arg}));
  }
}

TESSERA_WORKER(ddp_tied_refusals) {
  auto ctx = initWorker(w);
  auto table = at::randn({kVocab, kDim}).requires_grad_(true);
  // An untracked lookup without a sink would race the table's all-reduce.
  expectErrorContaining([&] { nn::embeddingAccumulateGrad(at::tensor({1, 2}), table, true); },
                        {"untracked lookup", "gatherEmbeddingRows"});
  DdpOptions o;
  o.gatherEmbeddingRows = true;
  o.onBucketReduced = [](const std::vector<at::Tensor>&) {};
  expectErrorContaining([&] { DistributedDataParallel({{"table", table}}, {}, ctx.world, o); },
                        {"onBucketReduced", "gatherEmbeddingRows"});
}

TEST(DdpTied, WhatCannotWorkIsRefused) { expectAllOk(runWorkers("ddp_tied_refusals", {.ranks = 2})); }
