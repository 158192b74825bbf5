// A pipeline chunk of the GPT or Llama language model; see lm.h.
#include "models/lm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "common/error.h"
#include "nn/init.h"
#include "parallel/context/chunks.h"
#include "parallel/tensor/mappings.h"

namespace tessera::models {

uint64_t blockSeed(uint64_t seed, int64_t layer) { return seed * 1000003ull + 101ull + static_cast<uint64_t>(layer); }
uint64_t headSeed(uint64_t seed) { return seed * 1000003ull + 7ull; }

pipeline::Partition partitionModel(const ModelConfig& c, int pp, int chunks, const std::vector<int>& layersPerStage) {
  pipeline::PartitionOptions o;
  o.pp = pp;
  o.chunks = chunks;
  o.layersPerStage = layersPerStage;
  o.embeddingParams = c.vocab * c.d;
  o.headParams = c.vocab * c.d + 2 * c.d;
  o.embeddingIsLookup = true;
  return pipeline::partitionBlocks(std::vector<int64_t>(c.layers, blockParamCount(c)), o);
}

namespace {
bool isLlama(const ModelConfig& c) { return c.arch == Arch::Llama; }

// The full initial table [V, d]: N(0, 1) for the GPT (as torch::nn::Embedding), N(0, 0.02²) for Llama.
at::Tensor fullTable(const ModelConfig& c, uint64_t seed) {
  auto t = tp::VocabParallelEmbeddingImpl::fullInitWeight(c.vocab, c.d, seed);
  return isLlama(c) ? t.mul_(0.02) : t;
}
}  // namespace

LmChunkImpl::LmChunkImpl(const ModelConfig& c, CommPtr group, CommPtr kvGroup, const pipeline::Partition& part,
                         int stage_, ChunkOptions o)
    : cfg(c), tp(std::move(group)), opts(o), stage(stage_) {
  validate(c);
  first = stage == 0;
  last = stage == part.numStages() - 1;
  firstBlock = part.firstBlock(stage);
  endBlock = part.endBlock(stage);
  const bool sp = o.sequenceParallel;
  const int cpSize = o.contextGroup ? o.contextGroup->size() : 1;
  TESSERA_CHECK(c.seqLen % (2 * cpSize) == 0 || cpSize == 1,
                "model: context parallel needs T divisible by 2 x cp (T {}, cp {})", c.seqLen, cpSize);
  localT = c.seqLen / cpSize;
  TESSERA_CHECK(!sp || localT % tp->size() == 0,
                "model: sequence parallel needs T{} divisible by tp (T {}, tp {})", cpSize > 1 ? " / cp" : "", localT,
                tp->size());
  if (first || (last && c.tiedEmbeddings)) {
    const auto table = fullTable(c, o.seed);
    if (first) emb = register_module("emb", tp::VocabParallelEmbedding(table, tp));
    if (last && !first && c.tiedEmbeddings) {
      const auto r = tp::vocabRange(c.vocab, tp->rank(), tp->size(), "head");
      headTable = register_parameter("head_table", table.narrow(0, r.start, r.size()).clone());
    }
  }
  if (first && c.positions == Positions::Learned) {
    auto gen = at::detail::createCPUGenerator(headSeed(o.seed) + 1);
    pos = register_parameter("pos", at::normal(0, 0.02, {c.seqLen, c.d}, gen));
  }
  for (int i = firstBlock; i < endBlock; ++i) {
    const auto name = fmt::format("blocks.{}", i);
    if (isLlama(c)) {
      llamaBlocks.push_back(register_module(
          fmt::format("block{}", i),
          LlamaBlock(c, tp, kvGroup, i, o.seed,
                     LlamaBlockOptions{sp, o.recompute, o.fusedKernels, o.contextGroup, o.repeatKvHeads},
                     name)));
    } else {
      torch::manual_seed(blockSeed(o.seed, i));
      auto b = register_module(fmt::format("block{}", i),
                               tp::ParallelBlock(tp, c.d, c.heads, sp, name, tp::BlockDropout{}, c.ffnSize()));
      b->attn->recomputeCore = b->mlp->recomputeActivation = o.recompute == Recompute::Selective;
      if (c.positions == Positions::Rope) b->attn->ropeTheta = c.ropeTheta;
      b->attn->context = o.contextGroup;
      b->setFusedKernels(o.fusedKernels);
      gptBlocks.push_back(b);
    }
  }
  if (last) {
    if (isLlama(c)) {
      norm = register_module("norm", RmsNorm(c.d, c.normEps, tp, sp));
      norm->fused = o.fusedKernels;
    } else {
      lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
    }
    if (!c.tiedEmbeddings) {
      tp::ParallelLinearOptions ho;
      ho.bias = false;
      ho.sequenceParallel = sp;
      ho.name = "head";
      ho.initFromRng = !isLlama(c);
      torch::manual_seed(headSeed(o.seed));
      head = register_module("head", tp::ColumnParallelLinear(tp, c.d, c.vocab, ho));
      if (isLlama(c)) {
        head->loadFull(nn::seededNormal(c.vocab, c.d, 0, 0.02, headSeed(o.seed)));
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
  const auto& g = opts.contextGroup;  // cp: the learned positions of this rank's tokens
  const auto rows = g ? cp::shard(pos, 0, g->size(), g->rank()) : pos;
  auto y = x + rows.unsqueeze(1);
  return opts.sequenceParallel ? tp::scatterSeq(y, tp) : y;
}

at::Tensor LmChunkImpl::finalNorm(const at::Tensor& x) {
  if (isLlama(cfg)) return norm->forward(x);
  return tp::tpLayerNorm(lnf, x, tp, opts.sequenceParallel, opts.fusedKernels);
}

at::Tensor LmChunkImpl::applyHead(const at::Tensor& h) {
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
  nn::Fn f;
  if (isLlama(cfg)) {
    f = [m = llamaBlocks[i].get()](const at::Tensor& v) { return m->forward(v); };
  } else {
    f = [m = gptBlocks[i].get()](const at::Tensor& v) { return m->forward(v); };
  }
  return opts.recompute == Recompute::Full ? nn::recompute(f, x) : f(x);
}

std::vector<LmChunkImpl::Part> LmChunkImpl::parts() {
  std::vector<Part> out;
  if (first) out.push_back([this](const at::Tensor& t) { return embed(t); });
  if (pos.defined()) out.push_back([this](const at::Tensor& x) { return addPositions(x); });
  for (int i = firstBlock; i < endBlock; ++i) {
    out.push_back([this, k = static_cast<size_t>(i - firstBlock)](const at::Tensor& x) { return block(k, x); });
  }
  if (last) {
    out.push_back([this](const at::Tensor& x) { return finalNorm(x); });
    out.push_back([this](const at::Tensor& x) { return applyHead(x); });
  }
  return out;
}

at::Tensor LmChunkImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (const auto& p : parts()) h = p(h);
  return h;
}

at::Tensor lmLoss(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp, int64_t vocab,
                  bool fused) {
  auto flat = logitsShard.reshape({-1, logitsShard.size(-1)});
  return tp::vocabParallelCrossEntropy(flat, targets.t().reshape({-1}), tp, vocab, fused, /*gradInLogits=*/fused);
}

}  // namespace tessera::models
