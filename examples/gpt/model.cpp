// The GPT of train_gpt; see model.h.
#include "model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/error.h"
#include "parallel/tensor/checkpoint_pieces.h"
#include "parallel/tensor/mappings.h"

namespace tessera::gpt {

std::string GptConfig::describe() const {
  return fmt::format("d {} layers {} heads {} vocab {} T {} ({:.1f} M parameters)", d, layers, heads, vocab, seqLen,
                     paramCount(*this) / 1e6);
}

GptConfig presetConfig(const std::string& name) {
  if (name == "tiny") return GptConfig{64, 4, 4, 256, 32};
  if (name == "small") return GptConfig{512, 8, 8, 8192, 256};
  if (name == "735m") return GptConfig{2048, 12, 16, 32000, 1024};
  throw Error(fmt::format("train_gpt: unknown model size '{}' (tiny, small, 735m)", name));
}

int64_t blockParamCount(const GptConfig& c) { return 12 * c.d * c.d + 13 * c.d; }
int64_t paramCount(const GptConfig& c) { return c.layers * blockParamCount(c) + 2 * c.vocab * c.d + 2 * c.d; }
double flopsPerToken(const GptConfig& c) {
  return 6.0 * static_cast<double>(paramCount(c)) + 12.0 * c.layers * c.d * c.seqLen;
}
uint64_t blockSeed(uint64_t seed, int64_t layer) { return seed * 1000003ull + 101ull + static_cast<uint64_t>(layer); }
uint64_t headSeed(uint64_t seed) { return seed * 1000003ull + 7ull; }

pipeline::Partition partitionGpt(const GptConfig& c, int pp, int chunks, const std::vector<int>& layersPerStage) {
  pipeline::PartitionOptions o;
  o.pp = pp;
  o.chunks = chunks;
  o.layersPerStage = layersPerStage;
  o.embeddingParams = c.vocab * c.d;
  o.headParams = c.vocab * c.d + 2 * c.d;
  o.embeddingIsLookup = true;
  return pipeline::partitionBlocks(std::vector<int64_t>(c.layers, blockParamCount(c)), o);
}

GptChunkImpl::GptChunkImpl(const GptConfig& c, CommPtr group, const pipeline::Partition& part, int stage_,
                           bool sequenceParallel, uint64_t seed)
    : cfg(c), tp(std::move(group)), sp(sequenceParallel), stage(stage_) {
  first = stage == 0;
  last = stage == part.numStages() - 1;
  firstBlock = part.firstBlock(stage);
  endBlock = part.endBlock(stage);
  TESSERA_CHECK(!sp || c.seqLen % tp->size() == 0,
                "train_gpt: sequence parallel needs T divisible by tp (T {} , tp {})", c.seqLen, tp->size());
  if (first) emb = register_module("emb", tp::VocabParallelEmbedding(c.vocab, c.d, tp, seed));
  for (int i = firstBlock; i < endBlock; ++i) {
    torch::manual_seed(blockSeed(seed, i));
    blocks.push_back(register_module(fmt::format("block{}", i),
                                     tp::ParallelBlock(tp, c.d, c.heads, sp, fmt::format("blocks.{}", i))));
  }
  if (last) {
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
    torch::manual_seed(headSeed(seed));
    tp::ParallelLinearOptions ho;
    ho.bias = false;
    ho.sequenceParallel = sp;
    ho.name = "head";
    head = register_module("head", tp::ColumnParallelLinear(tp, c.d, c.vocab, ho));
  }
}

at::Tensor GptChunkImpl::embed(const at::Tensor& tokens) {
  auto x = emb->forward(tokens.t().contiguous());  // [T, b, d], the same on every tp rank
  return sp ? tp::scatterSeq(x, tp) : x;            // this rank's T/tp tokens
}

at::Tensor GptChunkImpl::finalNormHead(const at::Tensor& x) {
  // With sp each rank normalises its own tokens: the LayerNorm's gradients sum over tp.
  auto h = sp ? at::layer_norm(x, {cfg.d}, tp::copyToRegion(lnf->weight, tp), tp::copyToRegion(lnf->bias, tp))
              : lnf->forward(x);
  return head->forward(h);  // [T, b, V/tp]
}

std::vector<GptChunkImpl::Part> GptChunkImpl::parts() {
  std::vector<Part> out;
  if (first) out.push_back([this](const at::Tensor& t) { return embed(t); });
  for (auto& b : blocks) out.push_back([m = b.get()](const at::Tensor& x) { return m->forward(x); });
  if (last) out.push_back([this](const at::Tensor& x) { return finalNormHead(x); });
  return out;
}

at::Tensor GptChunkImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (const auto& p : parts()) h = p(h);
  return h;
}

namespace {
// "attn.qkv.weight" → "qkv.weight" (the unsharded block's names, as loadFull and blockPieces).
std::string flatBlockName(const std::string& n) {
  for (const char* pre : {"attn.", "mlp."}) {
    if (n.rfind(pre, 0) == 0) return n.substr(std::string(pre).size());
  }
  return n;
}
bool blockParamReplicated(const std::string& flat) {
  return flat.rfind("ln1.", 0) == 0 || flat.rfind("ln2.", 0) == 0 || flat == "proj.bias" || flat == "fc2.bias";
}
}  // namespace

std::vector<FsdpUnitSpec> GptChunkImpl::fsdpUnits() {
  std::vector<FsdpUnitSpec> units;
  auto add = [&](const std::string& name, const std::vector<ChunkParam>& ps) {
    FsdpUnitSpec u;
    u.name = fmt::format("stage{}.{}", stage, name);
    for (const auto& p : ps) u.params.emplace_back(p.name, p.tensor);
    units.push_back(std::move(u));
  };
  const auto all = params();
  auto select = [&](const std::string& prefix) {
    std::vector<ChunkParam> out;
    for (const auto& p : all) {
      if (p.name.rfind(prefix, 0) == 0) out.push_back(p);
    }
    return out;
  };
  if (first) add("emb", select("emb."));
  for (int i = firstBlock; i < endBlock; ++i) add(fmt::format("block{}", i), select(fmt::format("blocks.{}.", i)));
  if (last) {
    auto h = select("lnf.");
    for (const auto& p : select("head.")) h.push_back(p);
    add("head", h);
  }
  return units;
}

std::vector<ChunkParam> GptChunkImpl::params() {
  std::vector<ChunkParam> out;
  if (first) out.push_back({"emb.weight", emb->weight, false});
  for (int i = firstBlock; i < endBlock; ++i) {
    for (const auto& kv : blocks[i - firstBlock]->named_parameters()) {
      const auto flat = flatBlockName(kv.key());
      out.push_back({fmt::format("blocks.{}.{}", i, flat), kv.value(), blockParamReplicated(flat)});
    }
  }
  if (last) {
    out.push_back({"lnf.weight", lnf->weight, true});
    out.push_back({"lnf.bias", lnf->bias, true});
    out.push_back({"head.weight", head->weight, false});
  }
  return out;
}

std::vector<checkpoint::Piece> GptChunkImpl::pieces() {
  std::vector<checkpoint::Piece> out;
  if (first) {
    out.push_back(checkpoint::chunkOf("emb.weight", emb->weight.detach(), {cfg.vocab, cfg.d}, 0, tp->rank()));
  }
  for (int i = firstBlock; i < endBlock; ++i) {
    for (auto& p : tp::blockPieces(*blocks[i - firstBlock], fmt::format("blocks.{}.", i))) out.push_back(std::move(p));
  }
  if (last) {
    out.push_back(checkpoint::whole("lnf.weight", lnf->weight.detach()));
    out.push_back(checkpoint::whole("lnf.bias", lnf->bias.detach()));
    for (auto& p : tp::columnPieces(*head, "head")) out.push_back(std::move(p));
  }
  return out;
}

at::Tensor gptLoss(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp, int64_t vocab) {
  auto flat = logitsShard.reshape({-1, logitsShard.size(-1)});
  return tp::vocabParallelCrossEntropy(flat, targets.t().reshape({-1}), tp, vocab);
}

}  // namespace tessera::gpt
