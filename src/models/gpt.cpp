// The GPT family's block and final norm; see gpt.h.
#include "tessera/models/gpt.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "tessera/models/kv_cache.h"
#include "tessera/parallel/tensor/checkpoint_pieces.h"

namespace tessera::models {

namespace {
// "attn.qkv.weight" → "qkv.weight" (the unsharded GPT block's names, as loadFull and blockPieces).
std::string flatBlockName(const std::string& n) {
  for (const char* pre : {"attn.", "mlp."}) {
    if (n.rfind(pre, 0) == 0) return n.substr(std::string(pre).size());
  }
  return n;
}
bool replicatedOverTp(const std::string& flat) {
  return flat.rfind("ln1.", 0) == 0 || flat.rfind("ln2.", 0) == 0 || flat == "proj.bias" || flat == "fc2.bias";
}
}  // namespace

GptBlockImpl::GptBlockImpl(const ModelConfig& c, CommPtr tp, int64_t layer, const LayerOptions& o) : cfg_(c) {
  torch::manual_seed(blockSeed(o.seed, layer));
  const auto name = fmt::format("blocks.{}", layer);
  block = register_module(
      "block", tp::ParallelBlock(std::move(tp), c.d, c.heads, o.sequenceParallel, name, tp::BlockDropout{}, c.ffnSize()));
  block->attn->recomputeCore = block->mlp->recomputeActivation = o.recompute == nn::Recompute::Selective;
  if (c.positions == Positions::Rope) block->attn->ropeTheta = c.ropeTheta;
  block->attn->context = o.context;
  block->setFusedKernels(o.fusedKernels);
}

at::Tensor GptBlockImpl::forward(const at::Tensor& x) { return block->forward(x); }

std::vector<NamedParam> GptBlockImpl::params(const std::string& prefix) {
  std::vector<NamedParam> ps;
  for (const auto& kv : block->named_parameters()) {
    const auto flat = flatBlockName(kv.key());
    ps.push_back({prefix + flat, kv.value(), replicatedOverTp(flat)});
  }
  return ps;
}

std::vector<checkpoint::Piece> GptBlockImpl::pieces(const std::string& prefix) {
  return tp::blockPieces(*block, prefix);
}

at::Tensor GptBlockImpl::decode(const at::Tensor& x, KvCache& cache, size_t layer) {
  auto& blk = *block;
  auto& attn = *blk.attn;
  const int64_t n = x.size(0), b = x.size(1), lh = attn.localHeads, hd = attn.headDim;
  auto a = tp::tpLayerNorm(blk.ln1, x, blk.tp, false, blk.fusedNorms);
  auto parts = attn.qkv->forward(a).view({n, b, 3, lh, hd}).unbind(2);
  if (attn.ropeTheta > 0) {
    const auto t = cachedRope(cfg_, attn.ropeTheta, {}, cache, n, x.device());
    parts[0] = nn::applyRope(parts[0], t);
    parts[1] = nn::applyRope(parts[1], t);
  }
  auto y = x + attn.proj->forward(cachedAttention(parts[0], parts[1], parts[2], cache, layer));
  return y + blk.mlp->forward(tp::tpLayerNorm(blk.ln2, y, blk.tp, false, blk.fusedNorms));
}

GptFinalNormImpl::GptFinalNormImpl(const ModelConfig& c, CommPtr tp_, const LayerOptions& o)
    : tp(std::move(tp_)), sequenceParallel(o.sequenceParallel), fused(o.fusedKernels) {
  ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
}

at::Tensor GptFinalNormImpl::forward(const at::Tensor& x) {
  return tp::tpLayerNorm(ln, x, tp, sequenceParallel, fused);
}

std::vector<NamedParam> GptFinalNormImpl::params(const std::string& prefix) {
  return {{prefix + "lnf.weight", ln->weight, true}, {prefix + "lnf.bias", ln->bias, true}};
}

std::vector<checkpoint::Piece> GptFinalNormImpl::pieces(const std::string& prefix) {
  return {checkpoint::whole(prefix + "lnf.weight", ln->weight.detach()),
          checkpoint::whole(prefix + "lnf.bias", ln->bias.detach())};
}

}  // namespace tessera::models
