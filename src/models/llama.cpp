#include "tessera/models/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "models/qk_norm.h"
#include "tessera/common/attention.h"
#include "tessera/common/error.h"
#include "tessera/models/kv_cache.h"
#include "tessera/nn/fused_activations.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/nn/init.h"
#include "tessera/parallel/context/attention.h"
#include "tessera/parallel/context/chunks.h"
#include "tessera/parallel/tensor/checkpoint_pieces.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::models {

CommPtr llamaKvGroup(const ModelConfig& c, const CommPtr& tp) {
  const int t = tp->size();
  const int64_t kv = c.kvH();
  TESSERA_CHECK(c.heads % t == 0, "llama: heads = {} is not divisible by the tensor-parallel size {}", c.heads, t);
  TESSERA_CHECK(kv % t == 0 || t % kv == 0,
                "llama: kv heads = {} and the tensor-parallel size {}: one must divide the other (kv heads are split "
                "over tp, or each replicated on tp / kv ranks)",
                kv, t);
  if (kv >= t) return nullptr;
  const int replicas = static_cast<int>(t / kv);
  return tp->split(tp->rank() / replicas, tp->rank(), fmt::format("{}.kv", tp->name()));
}

std::map<std::string, at::Tensor> llamaBlockInit(const ModelConfig& c, int64_t layer, uint64_t seed, bool experts) {
  const uint64_t base = (seed * 1000003ull + 101ull + static_cast<uint64_t>(layer)) * 16ull;
  const int64_t d = c.d, hd = c.headDim(), f = c.ffnSize();
  const double std = 0.02, out = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  std::map<std::string, at::Tensor> w;
  uint64_t k = 0;
  for (const auto& [name, rows, cols, s] : std::vector<std::tuple<std::string, int64_t, int64_t, double>>{
           {"wq.weight", c.heads * hd, d, std}, {"wk.weight", c.kvH() * hd, d, std},
           {"wv.weight", c.kvH() * hd, d, std}, {"wo.weight", d, c.heads * hd, out},
           {"w1.weight", f, d, std}, {"w3.weight", f, d, std}, {"w2.weight", d, f, out}}) {
    const bool mlpWeight = name == "w1.weight" || name == "w3.weight" || name == "w2.weight";
    if (c.moe.sparse(layer) && mlpWeight) break;  // the last three: a sparse layer's MLP is its experts
    w[name] = nn::seededNormal(rows, cols, 0, s, base + k++);
  }
  if (c.moe.sparse(layer) && experts) {
    for (auto& [n, t] : moeInit(c, layer, seed)) w["moe." + n] = t;
  }
  if (c.qkNorm != QkNorm::None) {
    const bool whole = c.qkNorm == QkNorm::Whole;
    w["q_norm.weight"] = at::ones({whole ? c.heads * hd : hd});
    w["k_norm.weight"] = at::ones({whole ? c.kvH() * hd : hd});
  }
  w["attn_norm.weight"] = at::ones({d});
  w["mlp_norm.weight"] = at::ones({d});
  return w;
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, int64_t layer,
                               const LayerOptions& o)
    : cfg_(c), tp_(std::move(tp)), kvGroup_(std::move(kvGroup)), o_(o), name_(fmt::format("blocks.{}", layer)) {
  const auto& name = name_;
  const int t = tp_->size(), r = tp_->rank();
  const int64_t kv = c.kvH();
  TESSERA_CHECK(c.heads % t == 0 && (kv % t == 0 || t % kv == 0),
                "llama block '{}': heads {} / kv heads {} do not fit tensor-parallel size {}", name, c.heads, kv, t);
  TESSERA_CHECK(c.ffnSize() % t == 0, "llama block '{}': FFN size {} is not divisible by the tensor-parallel size {}",
                name, c.ffnSize(), t);
  hd_ = c.headDim();
  lq_ = c.heads / t;
  firstQ_ = r * lq_;
  if (kv >= t) {
    lkv_ = kv / t;
    firstKv_ = r * lkv_;
  } else {
    kvReplicas_ = static_cast<int>(t / kv);
    lkv_ = 1;
    firstKv_ = r / kvReplicas_;
    TESSERA_CHECK(kvGroup_ && kvGroup_->size() == kvReplicas_,
                  "llama block '{}': kv heads {} on tp {} need a kv group of {} ranks (llamaKvGroup)", name, kv, t,
                  kvReplicas_);
  }
  lffn_ = c.ffnSize() / t;
  auto opts = [&](const std::string& n) {
    tp::ParallelLinearOptions lo;
    lo.bias = false;
    lo.sequenceParallel = o_.sequenceParallel;
    lo.initFromRng = false;
    lo.name = name + "." + n;
    return lo;
  };
  attnNorm = register_module("attn_norm", RmsNorm(c.d, c.normEps, tp_, o_.sequenceParallel));
  mlpNorm = register_module("mlp_norm", RmsNorm(c.d, c.normEps, tp_, o_.sequenceParallel));
  attnNorm->fused = mlpNorm->fused = o_.fusedKernels;
  // The column layers' "out" is the unsharded width this rank's rows are a tp-th of.
  wqkv = register_module("wqkv", tp::ColumnParallelLinear(tp_, c.d, t * (lq_ + 2 * lkv_) * hd_, opts("wqkv")));
  wo = register_module("wo", tp::RowParallelLinear(tp_, c.heads * hd_, c.d, opts("wo")));
  if (c.qkNorm != QkNorm::None) {
    const bool whole = c.qkNorm == QkNorm::Whole;
    qNorm = register_parameter("q_norm", at::ones({whole ? lq_ * hd_ : hd_}));
    kNorm = register_parameter("k_norm", at::ones({whole ? lkv_ * hd_ : hd_}));
  }
  if (c.moe.sparse(layer)) {
    moe = register_module("moe", Moe(c, layer,
                                     MoeOptions{.ep = o_.experts,
                                                .tp = tp_,
                                                .sequenceParallel = o_.sequenceParallel,
                                                .lossScale = o_.moeLossScale,
                                                .seed = o_.seed,
                                                .forceBalanced = o_.moeForceBalanced}));
  } else {
    w13 = register_module("w13", tp::ColumnParallelLinear(tp_, c.d, 2 * c.ffnSize(), opts("w13")));
    w2 = register_module("w2", tp::RowParallelLinear(tp_, c.ffnSize(), c.d, opts("w2")));
  }
  loadParts(llamaBlockInit(c, layer, o.seed, false), "", false);
}

void LlamaBlockImpl::loadFull(const std::map<std::string, at::Tensor>& full, const std::string& prefix) {
  loadParts(full, prefix, true);
}

void LlamaBlockImpl::loadParts(const std::map<std::string, at::Tensor>& full, const std::string& prefix,
                               bool experts) {
  auto get = [&](const std::string& n) {
    auto it = full.find(prefix + n);
    TESSERA_CHECK(it != full.end(), "llama block '{}': loadFull: no tensor '{}{}'", name_, prefix, n);
    return it->second;
  };
  at::NoGradGuard ng;
  auto rows = [](const at::Tensor& w, int64_t first, int64_t n) { return w.narrow(0, first, n); };
  auto q = rows(get("wq.weight"), firstQ_ * hd_, lq_ * hd_);
  auto k = rows(get("wk.weight"), firstKv_ * hd_, lkv_ * hd_);
  auto v = rows(get("wv.weight"), firstKv_ * hd_, lkv_ * hd_);
  wqkv->weight.copy_(at::cat({q, k, v}));
  const int r = tp_->rank();
  wo->loadFull(get("wo.weight"));
  if (moe) {
    if (experts) moe->loadFull(full, prefix + "moe.");
  } else {
    w13->weight.copy_(at::cat({rows(get("w1.weight"), r * lffn_, lffn_), rows(get("w3.weight"), r * lffn_, lffn_)}));
    w2->loadFull(get("w2.weight"));
  }
  attnNorm->weight.copy_(get("attn_norm.weight"));
  mlpNorm->weight.copy_(get("mlp_norm.weight"));
  if (qNorm.defined()) {
    const bool whole = cfg_.qkNorm == QkNorm::Whole;
    qNorm.copy_(whole ? rows(get("q_norm.weight"), firstQ_ * hd_, lq_ * hd_) : get("q_norm.weight"));
    kNorm.copy_(whole ? rows(get("k_norm.weight"), firstKv_ * hd_, lkv_ * hd_) : get("k_norm.weight"));
  }
}

std::pair<at::Tensor, at::Tensor> LlamaBlockImpl::normQk(const at::Tensor& q, const at::Tensor& k) const {
  if (!qNorm.defined()) return {q, k};
  const auto kind = cfg_.qkNorm;
  const detail::QkNormGroup qg{tp_, nullptr, 1}, kg{tp_, kvGroup_, kvReplicas_};
  return {detail::qkNorm(q, qNorm, kind, cfg_.normEps, cfg_.heads * hd_, qg),
          detail::qkNorm(k, kNorm, kind, cfg_.normEps, cfg_.kvH() * hd_, kg)};
}

at::Tensor LlamaBlockImpl::attention(const at::Tensor& x) {
  at::Tensor h;
  if (kvGroup_) {
    // Replicated kv rows: their gradient is summed over the ranks sharing the head.
    auto w = wqkv->weight;
    auto kvRows = tp::copyToRegion(w.narrow(0, lq_ * hd_, 2 * hd_), kvGroup_);
    auto lo = wqkv->opts;
    lo.accumulateGradInGemm = false;  // the weight is a cat, not the leaf
    h = tp::columnParallelLinear(x, at::cat({w.narrow(0, 0, lq_ * hd_), kvRows}), {}, tp_, lo);
  } else {
    h = wqkv->forward(x);
  }
  const int64_t s = h.size(0), b = h.size(1);
  auto tables = nn::ropeTables(cfg_.seqLen, hd_, cfg_.ropeTheta, cfg_.ropeScaling, x.device());
  if (o_.context) {  // the rows of this cp rank's positions
    const int n = o_.context->size(), r = o_.context->rank();
    tables = {cp::shard(tables.cos, 0, n, r), cp::shard(tables.sin, 0, n, r)};
  }
  at::Tensor q, k;
  if (o_.fusedKernels && !qNorm.defined()) {  // q and k rotated in place in the projection's output
    h = nn::ropeQkInPlace(h, lq_ + lkv_, tables);
    q = h.narrow(2, 0, lq_ * hd_).view({s, b, lq_, hd_});
    k = h.narrow(2, lq_ * hd_, lkv_ * hd_).view({s, b, lkv_, hd_});
  } else {
    std::tie(q, k) = normQk(h.narrow(2, 0, lq_ * hd_).view({s, b, lq_, hd_}),
                            h.narrow(2, lq_ * hd_, lkv_ * hd_).view({s, b, lkv_, hd_}));
    q = nn::applyRope(q, tables);
    k = nn::applyRope(k, tables);
  }
  auto v = h.narrow(2, (lq_ + lkv_) * hd_, lkv_ * hd_).view({s, b, lkv_, hd_});
  const nn::MultiFn core = [s, b, this](const std::vector<at::Tensor>& t) {
    if (o_.context) return cp::attention(t[0], t[1], t[2], o_.context).reshape({s, b, lq_ * hd_});
    auto bhsd = [](const at::Tensor& x) { return x.permute({1, 2, 0, 3}); };  // [B, h, S, hd]
    return causalSelfAttention(bhsd(t[0]), bhsd(t[1]), bhsd(t[2]), !o_.repeatKvHeads)
        .permute({2, 0, 1, 3})
        .reshape({s, b, lq_ * hd_});
  };
  auto a = o_.recompute == nn::Recompute::Selective ? nn::recompute(core, {q, k, v}) : core({q, k, v});
  return wo->forward(a);
}

at::Tensor LlamaBlockImpl::mlp(const at::Tensor& x) {
  if (moe) return moe->forward(x);
  auto h = w13->forward(x);  // [.., 2 ffn/tp]: [gate | up]
  if (o_.fusedKernels) {
    // Selective recompute without tp: w2 keeps h and recomputes the product for its weight gradient.
    if (o_.recompute == nn::Recompute::Selective && tp_->size() == 1 && w2->opts.fp8 == fp8::Recipe::Off &&
        !w2->opts.bias)
      return nn::swigluLinear(h, w2->weight, w2->opts.accumulateGradInGemm);
    return w2->forward(nn::swiglu(h));  // keeps h and w2's input, the product
  }
  const nn::Fn swiglu = [this](const at::Tensor& t) {
    return at::silu(t.narrow(-1, 0, lffn_)) * t.narrow(-1, lffn_, lffn_);
  };
  return w2->forward(o_.recompute == nn::Recompute::Selective ? nn::recompute(swiglu, h) : swiglu(h));
}

at::Tensor LlamaBlockImpl::forward(const at::Tensor& x) {
  TESSERA_CHECK(x.defined() && x.dim() == 3 && x.size(2) == cfg_.d,
                "llama block '{}': input must be [tokens, batch, {}] ([tokens/tp, batch, d] with sequence parallel), "
                "got [{}]",
                name_, cfg_.d, x.defined() ? c10::str(x.sizes()) : "undefined");
  // Fused: x1 is x (its residual gradient summed in attn_norm's backward), h = x1 + attention.
  auto [x1, a] = attnNorm->addForward(x, {});
  auto [h, m] = mlpNorm->addForward(x1, attention(a));
  return h + mlp(m);
}

std::vector<checkpoint::Piece> LlamaBlockImpl::pieces(const std::string& p) {
  const int64_t d = cfg_.d, kv = cfg_.kvH(), r = tp_->rank();
  auto w = wqkv->weight.detach();
  std::vector<checkpoint::Piece> out{
      checkpoint::whole(p + "attn_norm.weight", attnNorm->weight.detach()),
      {p + "wq.weight", {cfg_.heads * hd_, d}, {firstQ_ * hd_, 0}, w.narrow(0, 0, lq_ * hd_)},
      {p + "wk.weight", {kv * hd_, d}, {firstKv_ * hd_, 0}, w.narrow(0, lq_ * hd_, lkv_ * hd_)},
      {p + "wv.weight", {kv * hd_, d}, {firstKv_ * hd_, 0}, w.narrow(0, (lq_ + lkv_) * hd_, lkv_ * hd_)},
      checkpoint::whole(p + "mlp_norm.weight", mlpNorm->weight.detach())};
  for (auto& x : tp::rowPieces(*wo, p + "wo")) out.push_back(std::move(x));
  if (cfg_.qkNorm == QkNorm::PerHead) {
    out.push_back(checkpoint::whole(p + "q_norm.weight", qNorm.detach()));
    out.push_back(checkpoint::whole(p + "k_norm.weight", kNorm.detach()));
  } else if (cfg_.qkNorm == QkNorm::Whole) {
    out.push_back({p + "q_norm.weight", {cfg_.heads * hd_}, {firstQ_ * hd_}, qNorm.detach()});
    out.push_back({p + "k_norm.weight", {kv * hd_}, {firstKv_ * hd_}, kNorm.detach()});
  }
  if (moe) {
    for (auto& x : moe->pieces(p + "moe.")) out.push_back(std::move(x));
    return out;
  }
  auto f = w13->weight.detach();
  out.push_back({p + "w1.weight", {cfg_.ffnSize(), d}, {r * lffn_, 0}, f.narrow(0, 0, lffn_)});
  out.push_back({p + "w3.weight", {cfg_.ffnSize(), d}, {r * lffn_, 0}, f.narrow(0, lffn_, lffn_)});
  for (auto& x : tp::rowPieces(*w2, p + "w2")) out.push_back(std::move(x));
  return out;
}

std::vector<NamedParam> LlamaBlockImpl::params(const std::string& p) {
  NamedParam qkv{p + "wqkv.weight", wqkv->weight};
  if (kvReplicas_ > 1) {
    qkv.replicatedFrom = lq_ * hd_ * cfg_.d;
    qkv.replicas = kvReplicas_;
  }
  std::vector<NamedParam> out{{p + "attn_norm.weight", attnNorm->weight, true},
                              qkv,
                              {p + "wo.weight", wo->weight},
                              {p + "mlp_norm.weight", mlpNorm->weight, true}};
  if (qNorm.defined()) {
    const bool perHead = cfg_.qkNorm == QkNorm::PerHead;
    out.push_back({p + "q_norm.weight", qNorm, perHead});
    NamedParam k{p + "k_norm.weight", kNorm, perHead};
    if (!perHead && kvReplicas_ > 1) k.replicatedFrom = 0, k.replicas = kvReplicas_;
    out.push_back(k);
  }
  if (moe) {
    for (auto& x : moe->params(p + "moe.")) out.push_back(std::move(x));
  } else {
    out.push_back({p + "w13.weight", w13->weight});
    out.push_back({p + "w2.weight", w2->weight});
  }
  return out;
}

at::Tensor LlamaBlockImpl::decode(const at::Tensor& x, KvCache& cache, size_t layer) {
  const int64_t n = x.size(0), b = x.size(1);
  auto h = wqkv->forward(attnNorm->forward(x));  // [n, b, (lq + 2 lkv) hd]: [q | k | v]
  const auto t = cachedRope(cfg_, cfg_.ropeTheta, cfg_.ropeScaling, cache, n, x.device());
  auto [qn, kn] = normQk(h.narrow(2, 0, lq_ * hd_).view({n, b, lq_, hd_}),
                         h.narrow(2, lq_ * hd_, lkv_ * hd_).view({n, b, lkv_, hd_}));
  auto q = nn::applyRope(qn, t);
  auto k = nn::applyRope(kn, t);
  auto v = h.narrow(2, (lq_ + lkv_) * hd_, lkv_ * hd_).view({n, b, lkv_, hd_});
  auto y = x + wo->forward(cachedAttention(q, k, v, cache, layer));
  if (moe) return y + moe->forward(mlpNorm->forward(y));
  auto g = w13->forward(mlpNorm->forward(y));  // [gate | up]
  const int64_t f = g.size(-1) / 2;
  return y + w2->forward(at::silu(g.narrow(-1, 0, f)) * g.narrow(-1, f, f));
}

}  // namespace tessera::models
