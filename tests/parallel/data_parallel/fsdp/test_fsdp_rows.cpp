// FsdpOptions::gatherEmbeddingRows on a tied model (2 ranks, Gloo): the table's lookup untracked,
// its rows gathered; the root unit (the table, used again by the head) reduce-scatters first from
// the second step on, and three steps of training match single-process AdamW on the same data.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "harness/multiprocess.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

constexpr int64_t kVocab = 64, kDim = 16, kB = 4, kT = 8;

struct Tied {
  at::Tensor table, w1, w2;  // table [V, d] (lookup and head), blocks [d, d]
};

Tied makeTied() {
  auto g = at::detail::createCPUGenerator(7);
  Tied m;
  m.table = at::randn({kVocab, kDim}, g).requires_grad_(true);
  m.w1 = (at::randn({kDim, kDim}, g) * 0.3).requires_grad_(true);
  m.w2 = (at::randn({kDim, kDim}, g) * 0.3).requires_grad_(true);
  return m;
}

// Rank r's ids of a step; the reference takes every rank's, rank by rank.
at::Tensor ids(int step, int rank) {
  auto g = at::detail::createCPUGenerator(1000 * step + rank);
  return at::randint(kVocab, {kB, kT + 1}, g);
}

at::Tensor loss(const at::Tensor& logits, const at::Tensor& tok) {
  return at::cross_entropy_loss(logits.reshape({-1, kVocab}), tok.slice(1, 1).reshape({-1}));
}

}  // namespace

// arg: rows=0|1
TESSERA_WORKER(fsdp_tied_rows) {
  const bool rows = w.arg == "rows=1";
  auto ctx = initWorker(w);
  auto m = makeTied();
  FsdpOptions o;
  o.gatherEmbeddingRows = rows;
  FullyShardedDataParallel f({{"root", {{"table", m.table}}, false, {}}, {"b1", {{"w1", m.w1}}}, {"b2", {{"w2", m.w2}}}},
                             ctx.world, o);
  ShardedAdamW opt(f, {.lr = 1e-2});
  for (int step = 0; step < 3; ++step) {
    opt.zeroGrad();
    auto tok = ids(step, w.rank);
    auto in = tok.slice(1, 0, kT);
    auto h = f.runUnit(0, in, [&](const at::Tensor& t) {
      return rows ? nn::embeddingAccumulateGrad(t, m.table, /*untracked=*/true) : at::embedding(m.table, t);
    });
    h = f.runUnit(1, h, [&](const at::Tensor& x) { return at::tanh(at::matmul(x, m.w1)); });
    h = f.runUnit(2, h, [&](const at::Tensor& x) { return at::tanh(at::matmul(x, m.w2)); });
    loss(f.runUnit(0, h, [&](const at::Tensor& x) { return at::matmul(x, m.table.t()); }), tok).backward();
    opt.step();
    // After the first backward: rank 0's ready order (the root right after the head) with rows;
    // without, the reverse of the forward's first runs (the root last).
    const std::vector<int> want = rows ? std::vector<int>{0, 2, 1} : std::vector<int>{2, 1, 0};
    WCHECK(f.reduceOrder() == want, "step {}: reduce order [{}], expected [{}]", step, fmt::join(f.reduceOrder(), " "),
           fmt::join(want, " "));
  }
  auto got = f.fullStateDict();
  if (w.rank != 0) return;
  auto ref = makeTied();
  torch::optim::AdamW refOpt({ref.table, ref.w1, ref.w2}, torch::optim::AdamWOptions(1e-2).weight_decay(1e-2));
  for (int step = 0; step < 3; ++step) {
    refOpt.zero_grad();
    std::vector<at::Tensor> all;
    for (int r = 0; r < w.world; ++r) all.push_back(ids(step, r));
    auto tok = at::cat(all);
    auto h = at::embedding(ref.table, tok.slice(1, 0, kT));
    h = at::tanh(at::matmul(at::tanh(at::matmul(h, ref.w1)), ref.w2));
    loss(at::matmul(h, ref.table.t()), tok).backward();
    refOpt.step();
  }
  for (const auto& [name, t] : std::vector<std::pair<std::string, at::Tensor>>{
           {"table", ref.table}, {"w1", ref.w1}, {"w2", ref.w2}}) {
    const double d = (got.at(name) - t.detach()).abs().max().item<double>();
    WCHECK(d < 2e-5, "'{}' differs from single-process AdamW by {}", name, d);
  }
}

TEST(FsdpRows, TiedTableReducesFirstAndTrainsAsOneProcess) {
  expectAllOk(runWorkers("fsdp_tied_rows", {.ranks = 2, .timeout = std::chrono::seconds(60), .arg = "rows=1"}));
}

TEST(FsdpRows, WithoutRowsTheTableReducesLast) {
  expectAllOk(runWorkers("fsdp_tied_rows", {.ranks = 2, .timeout = std::chrono::seconds(60), .arg = "rows=0"}));
}
