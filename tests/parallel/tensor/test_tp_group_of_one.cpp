// "A group of one communicates nothing" (mappings.h, linear.h, linear_overlap.h, vocab.h,
// blocks.h), made testable: a real 1-rank Gloo group's collectives are no-ops anyway, so here
// it is wrapped in a RecordingComm (recording_comm.h), which logs every op issued through it,
// and each op's forward AND backward must leave the log empty:
// - every mapping op (output = input, gradient = upstream gradient);
// - ColumnParallelLinear with and without sequence parallel, overlapped or plain backward,
//   gathered output, accumulateGradInGemm; RowParallelLinear with and without sequence
//   parallel, input parallel or split here, accumulateGradInGemm (each against at::linear:
//   output, input and parameter gradients);
// - the vocab embedding and cross-entropy (against at::embedding / torch's cross_entropy);
// - the parallel block with and without sequence parallel (attention, LayerNorm regions, dropout).
// First the recorder itself is shown to log a collective issued through it.
// Tolerance for the linear comparisons: fp32 on the same values; only accumulateGradInGemm's own
// GEMM may sum in another order than at::linear's backward: rtol 1e-5, atol 1e-6.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fmt/ranges.h>

#include <functional>

#include "harness/multiprocess.h"
#include "tessera/parallel/tensor/blocks.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/tensor/mappings.h"
#include "tessera/parallel/tensor/vocab.h"
#include "recording_comm.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

at::Tensor seeded(std::vector<int64_t> shape, int seed) {
  auto g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: missing or shape mismatch", what);
  WCHECK(at::allclose(got, want, 1e-5, 1e-6), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}

// Runs fn (a forward and its backward) and fails if it issued any op through the recorder.
void expectSilent(EventLog& log, const std::string& what, const std::function<void()>& fn) {
  log.take();
  fn();
  auto events = log.take();
  WCHECK(events.empty(), "{} in a group of one issued [{}]", what, fmt::join(events, ", "));
}

constexpr int64_t IN = 6, OUT = 10, S = 4, B = 2;

// Runs `layer` (a column or row layer over a group of one) forward and backward, which must issue
// no collective, and checks it against at::linear on copies of its weight and bias.
template <typename Layer>
void checkAgainstLinear(EventLog& log, const std::string& name, Layer& layer, int seed) {
  auto w = layer->weight.detach().clone().requires_grad_(), b = layer->bias.detach().clone().requires_grad_();
  auto xv = seeded({S, B, IN}, seed), g = seeded({S, B, OUT}, seed + 1);
  auto x = xv.clone().requires_grad_(), xr = xv.clone().requires_grad_();
  at::Tensor y;
  expectSilent(log, name, [&] {
    y = layer->forward(x);
    (y * g).sum().backward();
  });
  auto yr = at::linear(xr, w, b);
  (yr * g).sum().backward();
  expectClose(y.detach(), yr.detach(), name + " output");
  expectClose(x.grad(), xr.grad(), name + " input grad");
  expectClose(layer->weight.grad(), w.grad(), name + " weight grad");
  expectClose(layer->bias.grad(), b.grad(), name + " bias grad");
}

void checkColumn(EventLog& log, const CommPtr& tp, bool sp, bool overlap, bool gather, bool acc) {
  tp::ParallelLinearOptions o;
  o.name = fmt::format("col(sp={}, overlap={}, gather={}, acc={})", sp, overlap, gather, acc);
  o.sequenceParallel = sp;
  o.overlapGradReduce = overlap;
  o.gatherOutput = gather;
  o.accumulateGradInGemm = acc;
  torch::manual_seed(1);
  tp::ColumnParallelLinear layer(tp, IN, OUT, o);
  checkAgainstLinear(log, o.name, layer, 2);
}

void checkRow(EventLog& log, const CommPtr& tp, bool sp, bool inputIsParallel, bool acc) {
  tp::ParallelLinearOptions o;
  o.name = fmt::format("row(sp={}, inputIsParallel={}, acc={})", sp, inputIsParallel, acc);
  o.sequenceParallel = sp;
  o.inputIsParallel = inputIsParallel;
  o.accumulateGradInGemm = acc;
  torch::manual_seed(4);
  tp::RowParallelLinear layer(tp, IN, OUT, o);
  checkAgainstLinear(log, o.name, layer, 5);
}

}  // namespace

TESSERA_WORKER(tp_group_of_one) {
  auto ctx = initWorker(w);
  WCHECK(ctx.world->size() == 1, "needs a group of one, got {}", ctx.world->size());
  EventLog log;
  const CommPtr tp = std::make_shared<RecordingComm>(ctx.world, &log);

  // The recorder sees what is issued through it (so an empty log below means: nothing issued).
  tp->allReduce(at::ones({2}))->wait();
  auto seen = log.take();
  WCHECK((seen == std::vector<std::string>{"launch:all_reduce", "wait:all_reduce"}), "recorder logged [{}]",
         fmt::join(seen, ", "));

  using Op = at::Tensor (*)(const at::Tensor&, const CommPtr&);
  const std::pair<const char*, Op> maps[] = {
      {"copyToRegion", tp::copyToRegion}, {"reduceFromRegion", tp::reduceFromRegion},
      {"gatherLastDim", tp::gatherLastDim}, {"splitLastDim", tp::splitLastDim},
      {"gatherSeq", tp::gatherSeq},       {"reduceScatterSeq", tp::reduceScatterSeq},
      {"scatterSeq", tp::scatterSeq}};
  for (const auto& [name, op] : maps) {
    auto x = seeded({S, B, IN}, 7).requires_grad_();
    auto g = seeded({S, B, IN}, 8);
    at::Tensor y;
    expectSilent(log, name, [&] {
      y = op(x, tp);
      y.backward(g);
    });
    WCHECK(y.equal(x) && x.grad().equal(g), "{}: not the identity in a group of one", name);
  }

  for (bool sp : {false, true}) {
    for (bool overlap : {true, false}) checkColumn(log, tp, sp, overlap, /*gather=*/false, /*acc=*/false);
    checkColumn(log, tp, sp, true, /*gather=*/true, false);
    checkColumn(log, tp, sp, true, false, /*acc=*/true);
    for (bool inputIsParallel : {true, false}) checkRow(log, tp, sp, inputIsParallel, /*acc=*/false);
    checkRow(log, tp, sp, true, /*acc=*/true);
  }

  // Vocab embedding and cross-entropy.
  const int64_t vocab = 8;
  tp::VocabParallelEmbedding emb(vocab, IN, tp, /*seed=*/3);
  auto ids = at::tensor({0, 7, 3, 3, 5, 1}, at::kLong).view({3, 2});
  auto embOut = seeded({3, 2, IN}, 9);
  at::Tensor e;
  expectSilent(log, "VocabParallelEmbedding", [&] {
    e = emb->forward(ids);
    (e * embOut).sum().backward();
  });
  WCHECK(e.detach().equal(at::embedding(tp::VocabParallelEmbeddingImpl::fullInitWeight(vocab, IN, 3), ids)),
         "embedding output");
  auto logits = seeded({5, vocab}, 10).requires_grad_();
  auto targets = at::tensor({0, 7, 2, 4, 4}, at::kLong);
  at::Tensor loss;
  expectSilent(log, "vocabParallelCrossEntropy", [&] {
    loss = tp::vocabParallelCrossEntropy(logits, targets, tp, vocab);
    loss.backward();
  });
  auto logitsRef = logits.detach().clone().requires_grad_();
  auto lossRef = at::cross_entropy_loss(logitsRef, targets);
  lossRef.backward();
  expectClose(loss.detach(), lossRef.detach(), "cross-entropy loss");
  expectClose(logits.grad(), logitsRef.grad(), "cross-entropy logits grad");

  // The block: attention and MLP over the layers above, LayerNorm regions with sequence parallel,
  // dropout (its masks are drawn on each rank: no communication).
  for (bool sp : {false, true}) {
    torch::manual_seed(11);
    tp::ParallelBlock block(tp, 8, 2, sp, fmt::format("block(sp={})", sp), tp::BlockDropout{/*p=*/0.5, /*seed=*/1});
    auto x = seeded({S, B, 8}, 12).requires_grad_();
    expectSilent(log, block->name, [&] { block->forward(x).square().sum().backward(); });
    WCHECK(x.grad().defined() && block->ln1->weight.grad().defined(), "{}: no gradients", block->name);
  }
}

TEST(TpGroupOfOne, IssuesNoCollectiveForwardOrBackward) {
  expectAllOk(runWorkers("tp_group_of_one", {.ranks = 1, .timeout = std::chrono::seconds(120)}));
}
