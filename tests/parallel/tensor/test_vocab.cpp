// Vocab-parallel embedding and cross-entropy for TP = 1, 2, 4 (Gloo, one process per rank),
// each against the unsharded reference computed in every worker from the same seeded tensors:
// outputs, losses, and gradients (this rank's shard of the full gradient). Ids and targets
// include 0, V-1 and both sides of every shard boundary; the embedding also with its gradient
// summed into .grad over two micro-batches (accumulateGrad). Bad sizes give clear errors.
// Worker arg "cuda": the same checks on NCCL with CUDA tensors (references stay on the CPU);
// built as test_vocab_gpu (TESSERA_TP_GPU_SUITE, in place of the CPU cases), it runs where 2
// GPUs are visible and skips visibly elsewhere.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "harness/multiprocess.h"
#ifdef TESSERA_TP_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/tensor/vocab.h"

using namespace tessera;
using namespace tessera::testing;
using tessera::tp::VocabParallelEmbedding;
using tessera::tp::vocabParallelCrossEntropy;

namespace {

constexpr int64_t kVocab = 16;  // divisible by 1, 2 and 4

// Random ids in [0, V) plus 0, V-1 and every shard boundary (b-1, b) for `tp` shards; the same
// on every rank (seeded generator).
at::Tensor edgeAndRandomIds(int64_t n, int tp, uint64_t seed) {
  std::vector<int64_t> edge = {0, kVocab - 1};
  for (int r = 1; r < tp; ++r) {
    edge.push_back(r * kVocab / tp - 1);
    edge.push_back(r * kVocab / tp);
  }
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor rnd = at::randint(0, kVocab, {n - static_cast<int64_t>(edge.size())}, gen, at::kLong);
  return at::cat({at::tensor(edge, at::kLong), rnd});
}

at::Tensor seededRandn(at::IntArrayRef shape, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen);
}

bool close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  return a.sizes() == b.sizes() && at::allclose(a, b, rtol, atol);
}

double maxDiff(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() ? (a - b).abs().max().item<double>() : -1.0;
}

}  // namespace

// Embedding: output equals torch::embedding with the full weight on every rank, the shard's
// gradient equals this rank's rows of the full weight's gradient. Both the seeded constructor
// and loading from a full weight.
TESSERA_WORKER(vocab_embedding) {
  auto ctx = initWorker(w, w.arg == "cuda" ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;
  const int64_t dim = 5, rows = kVocab / tp->size(), r0 = tp->rank() * rows;

  // Seeded constructor: the shard is our rows of the full weight the seed gives.
  VocabParallelEmbedding emb(kVocab, dim, tp, /*seed=*/1234, at::TensorOptions().device(dev));
  at::Tensor full = tp::VocabParallelEmbeddingImpl::fullInitWeight(kVocab, dim, 1234);
  WCHECK(emb->weight.sizes() == at::IntArrayRef({rows, dim}), "shard shape [{}, {}]", emb->weight.size(0),
         emb->weight.size(1));
  WCHECK(emb->weight.detach().cpu().equal(full.slice(0, r0, r0 + rows)), "rank {}: seeded shard differs", w.rank);
  WCHECK(emb->range().start == r0 && emb->range().end == r0 + rows, "range [{}, {})", emb->range().start,
         emb->range().end);

  // ids [4, 6] (2-D, to check the output shape) containing the edge ids.
  at::Tensor ids = edgeAndRandomIds(24, tp->size(), 99).view({4, 6});
  at::Tensor fullRef = full.clone().requires_grad_(true);
  at::Tensor ref = at::embedding(fullRef, ids);
  at::Tensor out = emb(ids.to(dev)).cpu();
  // Every output row is one rank's row plus exact zeros from the others: bitwise equal.
  WCHECK(out.sizes() == ref.sizes() && out.equal(ref.detach()), "rank {}: embedding output differs by {}", w.rank,
         maxDiff(out.detach(), ref.detach()));

  at::Tensor g = seededRandn(ref.sizes(), 7);
  ref.backward(g);
  out.backward(g);  // through .cpu() back to the device
  // Sums of the same upstream rows per vocab row; only the order of additions for repeated ids
  // may differ (fp32 round-off ~1e-7 on O(1) values), hence 1e-6.
  at::Tensor want = fullRef.grad().slice(0, r0, r0 + rows);
  at::Tensor got = emb->weight.grad().cpu();
  WCHECK(close(got, want, 1e-6, 1e-6), "rank {}: weight grad differs by {}", w.rank, maxDiff(got, want));

  // From a full weight, and loadFull; int32 ids give the same output.
  at::Tensor other = seededRandn({kVocab, dim}, 5);
  VocabParallelEmbedding fromFull(other.to(dev), tp);
  WCHECK(fromFull->weight.detach().cpu().equal(other.slice(0, r0, r0 + rows)), "rank {}: shard of full weight",
         w.rank);
  WCHECK(fromFull(ids.to(dev, at::kInt)).cpu().equal(at::embedding(other, ids)), "rank {}: int32 ids / fromFull",
         w.rank);
  emb->loadFull(other.to(dev));
  WCHECK(emb(ids.to(dev)).cpu().equal(at::embedding(other, ids)), "rank {}: output after loadFull differs", w.rank);

  // accumulateGrad (set by tp::setAccumulateGradInGemm): two micro-batches summed row by row into
  // .grad give the same output and this rank's rows of the dense reference's gradient sum.
  VocabParallelEmbedding acc(other.to(dev), tp);
  tp::setAccumulateGradInGemm(*acc, true);
  WCHECK(acc->accumulateGrad, "rank {}: setAccumulateGradInGemm left the embedding unset", w.rank);
  at::Tensor otherRef = other.clone().requires_grad_(true);
  for (uint64_t mb = 0; mb < 2; ++mb) {
    at::Tensor mbIds = edgeAndRandomIds(24, tp->size(), 40 + mb).view({4, 6});
    at::Tensor gy = seededRandn({4, 6, dim}, 50 + mb);
    at::Tensor y = acc(mbIds.to(dev)).cpu();
    at::Tensor yRef = at::embedding(otherRef, mbIds);
    WCHECK(y.equal(yRef.detach()), "rank {}: micro-batch {}: accumulating embedding's output differs", w.rank, mb);
    y.backward(gy);
    yRef.backward(gy);
  }
  at::Tensor wantAcc = otherRef.grad().slice(0, r0, r0 + rows);
  WCHECK(acc->weight.grad().defined() && close(acc->weight.grad().cpu(), wantAcc, 1e-6, 1e-6),
         "rank {}: accumulated weight grad differs by {}", w.rank,
         acc->weight.grad().defined() ? maxDiff(acc->weight.grad().cpu(), wantAcc) : -1.0);
}

// Cross-entropy: loss equals torch's cross_entropy on the full logits, the logits shard's
// gradient equals this rank's columns of the full gradient, for an upstream gradient of 2.5.
TESSERA_WORKER(vocab_cross_entropy) {
  auto ctx = initWorker(w, w.arg == "cuda" ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;
  const int64_t n = 20, width = kVocab / tp->size(), c0 = tp->rank() * width;

  at::Tensor targets = edgeAndRandomIds(n, tp->size(), 3);
  at::Tensor logits = seededRandn({n, kVocab}, 11) * 3.0;  // spread so softmax is far from uniform
  at::Tensor fullRef = logits.clone().requires_grad_(true);
  at::Tensor refLoss = at::cross_entropy_loss(fullRef, targets);

  at::Tensor shard = logits.slice(1, c0, c0 + width).to(dev).clone().requires_grad_(true);
  at::Tensor loss = vocabParallelCrossEntropy(shard, targets.to(dev), tp, kVocab).cpu();
  // Tolerance: both sides are fp32 log-sum-exp with the row max subtracted; they differ only in
  // the order of the V = 16 exp additions (per shard, then across ranks) and in log_softmax's
  // formulation, i.e. a few ulps per term: ≲ V·eps ≈ 2e-6 relative on a loss of about 6. A wrong or
  // missing term would move it by > 1e-2 here. So rtol 1e-5, atol 1e-6.
  WCHECK(loss.dim() == 0 && close(loss.detach(), refLoss.detach(), 1e-5, 1e-6), "rank {}: loss {} vs torch {}",
         w.rank, loss.item<double>(), refLoss.item<double>());

  (refLoss * 2.5).backward();
  (loss * 2.5).backward();
  // Gradients are (softmax − one-hot)·2.5/N, O(0.1); same round-off argument: 1e-5 / 1e-6.
  at::Tensor want = fullRef.grad().slice(1, c0, c0 + width);
  at::Tensor got = shard.grad().cpu();
  WCHECK(close(got, want, 1e-5, 1e-6), "rank {}: logits grad differs by {}", w.rank, maxDiff(got, want));

  // Every target owned by another rank (or all by this one) still gives the full loss.
  at::Tensor allLast = at::full({n}, kVocab - 1, at::kLong);
  at::Tensor l2 = vocabParallelCrossEntropy(shard.detach(), allLast.to(dev), tp).cpu();
  at::Tensor r2 = at::cross_entropy_loss(logits, allLast);
  WCHECK(close(l2, r2, 1e-5, 1e-6), "rank {}: all-last-id loss {} vs {}", w.rank, l2.item<double>(),
         r2.item<double>());
}

#ifdef TESSERA_TP_GPU_SUITE
TEST(VocabParallelGpu, EmbeddingMatchesUnshardedOnNccl) {
  TESSERA_REQUIRE_GPUS(2);
  auto o = gpuRun(180);
  o.arg = "cuda";
  expectAllOk(runWorkers("vocab_embedding", o));
}

TEST(VocabParallelGpu, CrossEntropyMatchesTorchOnNccl) {
  TESSERA_REQUIRE_GPUS(2);
  auto o = gpuRun(180);
  o.arg = "cuda";
  expectAllOk(runWorkers("vocab_cross_entropy", o));
}
#else
class VocabParallel : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallel, EmbeddingMatchesUnshardedOutputAndWeightGrad) {
  expectAllOk(runWorkers("vocab_embedding", {.ranks = GetParam(), .timeout = std::chrono::seconds(120)}));
}

TEST_P(VocabParallel, CrossEntropyMatchesTorchLossAndLogitsGrad) {
  expectAllOk(runWorkers("vocab_cross_entropy", {.ranks = GetParam(), .timeout = std::chrono::seconds(120)}));
}

INSTANTIATE_TEST_SUITE_P(TP, VocabParallel, ::testing::Values(1, 2, 4));

// Sizes that do not fit give errors naming the layer/op and the numbers; all are detected
// before any communication, on every rank alike (so no rank is left waiting).
TESSERA_WORKER(vocab_errors) {
  auto ctx = initWorker(w);
  const auto& tp = ctx.world;  // 4 ranks
  expectErrorContaining([&] { VocabParallelEmbedding(10, 3, tp); },
                        {"VocabParallelEmbedding", "vocab size 10", "tensor-parallel size 4"});
  expectErrorContaining([&] { VocabParallelEmbedding(at::zeros({6, 3}), tp); },
                        {"VocabParallelEmbedding", "vocab size 6", "tensor-parallel size 4"});
  VocabParallelEmbedding emb(8, 3, tp);
  expectErrorContaining([&] { emb->loadFull(at::zeros({8, 4})); }, {"loadFull", "[8, 3]", "[8, 4]"});
  expectErrorContaining([&] { emb(at::tensor({0, 8}, at::kLong)); }, {"VocabParallelEmbedding", "vocab size is 8"});
  expectErrorContaining([&] { emb(at::zeros({2})); }, {"VocabParallelEmbedding", "int64 or int32", "Float"});

  at::Tensor shard = at::zeros({3, 4});  // N = 3, width 4, tp 4 → V = 16
  at::Tensor t = at::zeros({3}, at::kLong);
  const char* op = "vocabParallelCrossEntropy";
  expectErrorContaining([&] { vocabParallelCrossEntropy(shard, t, tp, 18); },
                        {op, "width 4", "size 4", "= 16", "vocab size 18"});
  expectErrorContaining([&] { vocabParallelCrossEntropy(shard, t.to(at::kInt), tp); }, {op, "int64", "Int"});
  expectErrorContaining([&] { vocabParallelCrossEntropy(shard, at::zeros({4}, at::kLong), tp); },
                        {op, "[N] = [3]", "[4]"});
  expectErrorContaining([&] { vocabParallelCrossEntropy(at::zeros({12}), t, tp); }, {op, "2-D", "[12]"});
  expectErrorContaining([&] { vocabParallelCrossEntropy(shard, at::full({3}, 16, at::kLong), tp); },
                        {op, "[16, 16]", "vocab size is 16"});
  expectErrorContaining([&] { vocabParallelCrossEntropy(at::zeros({0, 4}), at::zeros({0}, at::kLong), tp); },
                        {op, "N = 0"});
  // The group still works after the rejected calls.
  at::Tensor ok = vocabParallelCrossEntropy(shard, t, tp);
  WCHECK(close(ok, at::full({}, std::log(16.0)), 1e-6, 1e-6), "uniform logits loss {}", ok.item<double>());
}

TEST(VocabParallel, IndivisibleVocabAndBadShapesGiveClearErrors) {
  expectAllOk(runWorkers("vocab_errors", {.ranks = 4, .timeout = std::chrono::seconds(120)}));
}
#endif  // TESSERA_TP_GPU_SUITE
