// A pipeline chunk of the GPT or Llama language model; see lm.h.
#include "tessera/models/lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tessera/common/error.h"
#include "tessera/nn/init.h"
#include "tessera/parallel/context/chunks.h"
#include "tessera/parallel/tensor/mappings.h"
#include "tessera/parallel/tensor/blocks.h"

namespace tessera::models {

namespace {
bool isLlama(const ModelConfig& c) { return c.arch == Arch::Llama; }

// The full initial table [V, d]: N(0, 1) for the GPT (as torch::nn::Embedding), N(0, 0.02²) for Llama.
at::Tensor fullTable(const ModelConfig& c, uint64_t seed) {
  auto t = tp::VocabParallelEmbeddingImpl::fullInitWeight(c.vocab, c.d, seed);
  return isLlama(c) ? t.mul_(0.02) : t;
}
}  // namespace

LmChunkImpl::LmChunkImpl(const ModelConfig& c, CommPtr group, CommPtr kvGroup, ChunkRange r, LayerOptions o)
    : cfg(c), tp(std::move(group)), opts(std::move(o)), range(r) {
  validate(c);
  TESSERA_CHECK(r.stages >= 1 && r.stage >= 0 && r.stage < r.stages && r.firstBlock >= 0 &&
                    r.firstBlock <= r.endBlock && r.endBlock <= c.layers,
                "model: stage {} of {} with blocks [{}, {}) does not fit a model of {} blocks", r.stage, r.stages,
                r.firstBlock, r.endBlock, c.layers);
  first = r.stage == 0;
  last = r.stage == r.stages - 1;
  const bool sp = opts.sequenceParallel;
  const int cpSize = opts.context ? opts.context->size() : 1;
  TESSERA_CHECK(c.seqLen % (2 * cpSize) == 0 || cpSize == 1,
                "model: context parallel needs T divisible by 2 x cp (T {}, cp {})", c.seqLen, cpSize);
  localT = c.seqLen / cpSize;
  TESSERA_CHECK(!sp || localT % tp->size() == 0,
                "model: sequence parallel needs T{} divisible by tp (T {}, tp {})", cpSize > 1 ? " / cp" : "", localT,
                tp->size());
  if (first || (last && c.tiedEmbeddings)) {
    const auto table = fullTable(c, opts.seed);
    if (first) emb = register_module("emb", tp::VocabParallelEmbedding(table, tp));
    if (last && !first && c.tiedEmbeddings) {
      const auto v = tp::vocabRange(c.vocab, tp->rank(), tp->size(), "head");
      headTable = register_parameter("head_table", table.narrow(0, v.start, v.size()).clone());
    }
  }
  if (first && c.positions == Positions::Learned) {
    auto gen = at::detail::createCPUGenerator(headSeed(opts.seed) + 1);
    pos = register_parameter("pos", at::normal(0, 0.02, {c.seqLen, c.d}, gen));
  }
  for (int i = r.firstBlock; i < r.endBlock; ++i) {
    blocks.push_back(register_module(fmt::format("block{}", i), makeBlock(c, tp, kvGroup, i, opts)));
  }
  if (last) {
    norm = register_module("norm", makeFinalNorm(c, tp, opts));
    if (!c.tiedEmbeddings) {
      tp::ParallelLinearOptions ho;
      ho.bias = false;
      ho.sequenceParallel = sp;
      ho.name = "head";
      ho.initFromRng = !isLlama(c);
      torch::manual_seed(headSeed(opts.seed));
      head = register_module("head", tp::ColumnParallelLinear(tp, c.d, c.vocab, ho));
      if (isLlama(c)) {
        head->loadFull(nn::seededNormal(c.vocab, c.d, 0, 0.02, headSeed(opts.seed)));
      }
    }
  }
}

at::Tensor LmChunkImpl::tiedTable() {
  if (!cfg.tiedEmbeddings) return {};
  if (first) return emb->weight;
  return last ? headTable : at::Tensor();
}

at::Tensor LmChunkImpl::embed(const at::Tensor& tokens) {
  TESSERA_CHECK(tokens.dim() == 2 && tokens.size(1) == localT,
                "model: the first stage takes tokens [batch, {}]{}, got [{}]", localT,
                localT != cfg.seqLen ? " (this cp rank's positions)" : "", c10::str(tokens.sizes()));
  auto x = emb->forward(tokens.t().contiguous());  // [T, b, d], the same on every tp rank
  if (pos.defined() || !opts.sequenceParallel) return x;
  return tp::scatterSeq(x, tp);  // this rank's T/tp tokens
}

at::Tensor LmChunkImpl::addPositions(const at::Tensor& x) {
  const auto& g = opts.context;  // cp: the learned positions of this rank's tokens
  const auto rows = g ? cp::shard(pos, 0, g->size(), g->rank()) : pos;
  auto y = x + rows.unsqueeze(1);
  return opts.sequenceParallel ? tp::scatterSeq(y, tp) : y;
}

at::Tensor LmChunkImpl::logits(const at::Tensor& h) {
  tp::ParallelLinearOptions ho;
  at::Tensor w, b;
  if (!cfg.tiedEmbeddings) {
    ho = head->opts, w = head->weight, b = head->bias;
  } else {
    ho.bias = false;
    ho.sequenceParallel = opts.sequenceParallel;
    ho.name = "head (tied)";
    w = tiedTable();
  }
  // cuBLAS's fast GEMMs need 16-byte-aligned leading dimensions, and the logits' is this shard of
  // the vocabulary: an odd one (GPT-2's 50257) takes a kernel several times slower for each of the
  // head's three GEMMs. Then the rows are padded with zeros to a multiple of 64 and the logits are
  // the first `rows` columns of the aligned buffer, a view the fused cross-entropy reads and
  // writes its gradient into where it is. GPUs only (the CPU's GEMMs gain nothing).
  const int64_t rows = w.size(0);
  const int64_t padded = rows % 8 == 0 || !h.is_cuda() || ho.gatherOutput ? rows : (rows + 63) / 64 * 64;
  if (padded == rows) return tp::columnParallelLinear(h, w, b, tp, ho);  // [T, b, V/tp]
  ho.accumulateGradInGemm = false;  // the padded weight is no leaf: its gradient comes back through autograd
  auto wp = at::constant_pad_nd(w, {0, 0, 0, padded - rows});
  auto bp = b.defined() ? at::constant_pad_nd(b, {0, padded - rows}) : b;
  return tp::columnParallelLinear(h, wp, bp, tp, ho).narrow(-1, 0, rows);
}

at::Tensor LmChunkImpl::block(size_t i, const at::Tensor& x) {
  const nn::Fn f = [m = blocks[i].get()](const at::Tensor& v) { return m->forward(v); };
  return opts.recompute == nn::Recompute::Full ? nn::recompute(f, x) : f(x);
}

at::Tensor LmChunkImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (const auto& p : parts()) h = p.run(h);
  return h;
}

at::Tensor lmLoss(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp, int64_t vocab,
                  bool fused) {
  auto flat = logitsShard.reshape({-1, logitsShard.size(-1)});
  return tp::vocabParallelCrossEntropy(flat, targets.t().reshape({-1}), tp, vocab, fused, /*gradInLogits=*/fused);
}

}  // namespace tessera::models
