// Five training steps of a tiny tensor-parallel GPT against single-process training of the
// unsharded model (tests/models' TinyGpt), TP = 2 and 4, with and without sequence parallel,
// each with AdamW (lr 1e-2, weight decay 0.01) and with SGD (lr 0.5, momentum 0.9).
//
// TP model: VocabParallelEmbedding + learned positions → (sequence parallel: scatterSeq) →
// 2 ParallelBlocks → final LayerNorm → ColumnParallelLinear head over the vocab (overlapped
// backward) → vocabParallelCrossEntropy. Its parameters are loaded from the seeded TinyGpt
// (loadFull keeps each rank's shard). Every TP rank trains on the same batch.
//
// Checked: the loss at every step on every rank; that it falls; after the last step every
// parameter, the shards gathered over tp, against the reference; and that the replicated
// parameters (LayerNorms, positions, row-parallel biases) are bitwise equal on all ranks.
//
// Tolerances. fp32 throughout; the sharded model computes the same sums in another order
// (row-parallel partial sums over tp, the cross-entropy's max/sum-exp reductions, the
// embedding's masked all-reduce), so gradients differ by rounding (~1e-7 relative).
// - loss: atol 1e-5 (loss ≈ 4 → 3; observed ≤ 5e-7).
// - SGD: the update is linear in the gradient, so parameters differ by about lr × the
//   gradients' rounding: atol 2e-6 + rtol 1e-5 (observed ≤ 2.4e-7; parameters move ~1e-1).
// - AdamW: the update lr·m/(√v+ε) divides by the gradient's own size, so where the exact
//   gradient is ~0 the rounding noise itself is normalised into steps of up to ~lr. The key
//   part of the qkv bias is such a case (softmax is shift-invariant: its exact gradient is 0),
//   and there the two runs differ by up to 1.1e-4 after 5 steps (everything else ≤ 6e-5).
//   So the tolerance is in units of lr: atol 0.05·lr = 5e-4, while parameters move by
//   5e-2 .. 1.4e-1. A wrong gradient (a missing or doubled reduction, a wrong shard) moves
//   elements by ~lr per step and the loss by ≥ 1e-3, far outside both tolerances.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/parallel/tensor/blocks.h"
#include "tessera/parallel/tensor/mappings.h"
#include "tessera/parallel/tensor/vocab.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int STEPS = 5;
constexpr int64_t BATCH = 2;
constexpr double ADAM_LR = 1e-2, SGD_LR = 0.5, LOSS_ATOL = 1e-5;
const TinyGptOptions kGpt{/*vocab=*/64, /*d=*/32, /*layers=*/2, /*heads=*/4, /*seqLen=*/16};

// The tiny GPT with tensor parallelism; activations [T, B, d] (tokens first).
struct TpGptImpl : torch::nn::Module {
  TpGptImpl(CommPtr g, const TinyGptOptions& o, bool seqPar) : tp(std::move(g)), opts(o), sp(seqPar) {
    tok = register_module("tok", tp::VocabParallelEmbedding(o.vocab, o.d, tp));
    pos = register_parameter("pos", at::zeros({o.seqLen, o.d}));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.layers; ++i)
      blocks->push_back(tp::ParallelBlock(tp, o.d, o.heads, sp, fmt::format("blocks.{}", i)));
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d})));
    tp::ParallelLinearOptions ho;
    ho.bias = false;
    ho.sequenceParallel = sp;
    ho.name = "head";
    ho.initFromRng = false;
    head = register_module("head", tp::ColumnParallelLinear(tp, o.d, o.vocab, ho));
  }

  void loadFull(TinyGpt& ref) {
    auto full = ref->named_parameters(true);
    tok->loadFull(ref->tok->weight);
    for (int64_t i = 0; i < opts.layers; ++i)
      blocks[i]->as<tp::ParallelBlock>()->loadFull(full, fmt::format("blocks.{}.", i));
    head->loadFull(ref->head->weight);
    at::NoGradGuard g;
    pos.copy_(ref->pos);
    lnf->weight.copy_(ref->lnf->weight);
    lnf->bias.copy_(ref->lnf->bias);
  }

  // tokens, targets: [B, T] as for TinyGpt. Collective over tp.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    auto x = tok->forward(tokens.t().contiguous()) + pos.slice(0, 0, tokens.size(1)).unsqueeze(1);
    if (sp) x = tp::scatterSeq(x, tp);  // each rank keeps its tokens; bwd all-gathers
    for (const auto& b : *blocks) x = b->as<tp::ParallelBlock>()->forward(x);
    if (sp)  // own tokens only: the LayerNorm's gradients are summed over tp
      x = at::layer_norm(x, {opts.d}, tp::copyToRegion(lnf->weight, tp), tp::copyToRegion(lnf->bias, tp));
    else
      x = lnf->forward(x);
    auto logits = head->forward(x);  // [T, B, V/tp]
    return tp::vocabParallelCrossEntropy(logits.reshape({-1, logits.size(-1)}), targets.t().reshape({-1}), tp,
                                         opts.vocab);
  }

  CommPtr tp;
  TinyGptOptions opts;
  bool sp;
  tp::VocabParallelEmbedding tok{nullptr};
  at::Tensor pos;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
  tp::ColumnParallelLinear head{nullptr};
};
TORCH_MODULE(TpGpt);

// Every rank's t, stacked: [tp, ...t.shape]. Collective.
at::Tensor gatherAll(const at::Tensor& t, const CommPtr& c) {
  auto in = t.detach().contiguous();
  std::vector<int64_t> shape{c->size()};
  for (auto s : in.sizes()) shape.push_back(s);
  auto out = at::empty(shape, in.options());
  c->allGather(out, in)->wait();
  return out;
}
// The unsharded qkv rows [q | k | v] (head-major) in the rank-major order of gathered shards.
at::Tensor qkvRankMajor(const at::Tensor& full, int64_t n) {
  auto shape = full.sizes().vec();
  std::vector<int64_t> split{3, n, shape[0] / (3 * n)};
  split.insert(split.end(), shape.begin() + 1, shape.end());
  return full.reshape(split).transpose(0, 1).reshape(full.sizes());
}

// Trains the TP model and the reference side by side and compares them (collective over tp).
void trainAndCompare(const CommPtr& tp, bool sp, bool sgd) {
  // See the header: SGD's error stays at the gradients' rounding level; AdamW's is in units of lr.
  const double pAtol = sgd ? 2e-6 : 0.05 * ADAM_LR, pRtol = sgd ? 1e-5 : 0.0;
  const int64_t n = tp->size();
  const std::string label = fmt::format("tp{} {} {}", n, sp ? "sp" : "plain", sgd ? "sgd" : "adamw");

  auto ref = makeTinyGpt(/*seed=*/42, kGpt);
  TpGpt model(tp, kGpt, sp);
  model->loadFull(ref);
  auto makeOpt = [&](std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (sgd) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(SGD_LR).momentum(0.9));
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(ADAM_LR).weight_decay(0.01));
  };
  auto refOpt = makeOpt(ref->parameters()), opt = makeOpt(model->parameters());

  // One batch, the same on every tp rank, for every step: random targets give a loss near
  // ln(vocab) that only falls when the model memorises them, so a falling loss shows training.
  const auto batch = gptBatch(/*seed=*/100, /*rank=*/0, BATCH, kGpt);
  std::map<std::string, at::Tensor> init;
  for (auto& p : ref->named_parameters(true)) init[p.key()] = p.value().detach().clone();
  std::vector<double> losses, refLosses;
  for (int step = 0; step < STEPS; ++step) {
    refOpt->zero_grad();
    auto refLoss = gptLoss(ref->forward(batch.tokens), batch.targets);
    refLoss.backward();
    refOpt->step();
    opt->zero_grad();
    auto loss = model->loss(batch.tokens, batch.targets);
    loss.backward();
    opt->step();
    losses.push_back(loss.item<double>());
    refLosses.push_back(refLoss.item<double>());
    WCHECK(std::abs(losses.back() - refLosses.back()) <= LOSS_ATOL, "{} step {}: loss {} vs unsharded {}", label,
           step, losses.back(), refLosses.back());
  }
  WCHECK(losses.back() < losses.front() - 0.1, "{}: training did not reduce the loss: [{}]", label,
         fmt::join(losses, ", "));

  // Gathered shards vs the unsharded parameters. (name, dim the shards split; -1 replicated)
  auto refParams = ref->named_parameters(true);
  double worst = 0;
  std::string worstName;
  for (const auto& p : model->named_parameters(true)) {
    const auto& name = p.key();
    auto all = gatherAll(p.value(), tp);
    const bool qkv = name.find("qkv") != std::string::npos;
    int64_t dim = -1;
    if (name == "tok.weight" || name == "head.weight" || qkv || name.find("fc1") != std::string::npos) dim = 0;
    if (name.find("fc2.weight") != std::string::npos || name.find("proj.weight") != std::string::npos) dim = 1;
    auto refName = name;
    for (std::string wrapper : {"attn.", "mlp."}) {  // the unsharded block has no sub-modules
      auto at = refName.find(wrapper);
      if (at != std::string::npos) refName.erase(at, wrapper.size());
    }
    const auto* want = refParams.find(refName);
    WCHECK(want, "no reference parameter '{}' for '{}'", refName, name);
    at::Tensor got;
    if (dim < 0) {
      for (int64_t r = 1; r < n; ++r)
        WCHECK(all[r].equal(all[0]), "replicated parameter {} differs between rank 0 and rank {}", name, r);
      got = all[0];
    } else {
      got = at::cat(all.unbind(0), dim);
    }
    auto wantT = qkv ? qkvRankMajor(want->detach(), n) : want->detach();
    WCHECK(got.sizes() == wantT.sizes(), "{}: gathered shape [{}] vs [{}]", name, fmt::join(got.sizes(), ","),
           fmt::join(wantT.sizes(), ","));
    double d = (got - wantT).abs().max().item<double>();
    if (d > worst) worst = d, worstName = name;
    WCHECK(at::allclose(got, wantT, pRtol, pAtol), "{}: {} after {} steps: max |diff| = {} (moved by up to {})",
           label, name, STEPS, d, (wantT - init.at(refName)).abs().max().item<double>());
  }
  if (tp->rank() == 0)
    fmt::print("{}: losses [{}]; max |loss diff| {:.2e}; max |param diff| {:.2e} ({})\n", label,
               fmt::join(losses, ", "),
               [&] {
                 double m = 0;
                 for (int i = 0; i < STEPS; ++i) m = std::max(m, std::abs(losses[i] - refLosses[i]));
                 return m;
               }(),
               worst, worstName);
}
}  // namespace

TESSERA_WORKER(tp_train) {
  auto ctx = initWorker(w);
  for (bool sgd : {false, true}) trainAndCompare(ctx.world, w.arg == "sp", sgd);
}

struct TrainCase {
  int ranks;
  const char* mode;
};
void PrintTo(const TrainCase& c, std::ostream* os) { *os << "tp" << c.ranks << " " << c.mode; }

class TpTrain : public ::testing::TestWithParam<TrainCase> {};

TEST_P(TpTrain, FiveStepsMatchSingleProcess) {
  auto c = GetParam();
  auto results = runWorkers("tp_train", {.ranks = c.ranks, .arg = c.mode});
  expectAllOk(results);
  for (const auto& r : results)
    if (r.rank == 0) std::cout << r.output;
}

INSTANTIATE_TEST_SUITE_P(Cases, TpTrain,
                         ::testing::Values(TrainCase{2, "plain"}, TrainCase{4, "plain"}, TrainCase{2, "sp"},
                                           TrainCase{4, "sp"}));
