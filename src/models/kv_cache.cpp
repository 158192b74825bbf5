#include "models/kv_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "parallel/tensor/blocks.h"

namespace tessera::models {

namespace {

int64_t localKvHeads(const ModelConfig& c, int tp) {
  if (c.arch == Arch::Gpt) return c.heads / tp;
  return c.kvH() >= tp ? c.kvH() / tp : 1;
}

void checkWhole(const LmChunkImpl& m) {
  TESSERA_CHECK(m.first && m.last,
                "inference: the chunk holds stage {} only: inference runs a whole model (pp = 1; pipeline inference "
                "is not supported)",
                m.stage);
  TESSERA_CHECK(!m.opts.sequenceParallel, "inference: build the model without sequence parallel");
}

// Rows [pos, pos + n) of the rotary tables, as applyRope takes them (it rotates rows 0 .. n-1).
nn::RopeTables ropeAt(const ModelConfig& c, double theta, const nn::RopeScaling& s, int64_t pos, int64_t n,
                      int64_t capacity, at::Device device) {
  const auto t = nn::ropeTables(std::max(capacity, c.seqLen), c.headDim(), theta, s, device);
  return {t.cos.narrow(0, pos, n), t.sin.narrow(0, pos, n)};
}

// q [n, b, hq, hd]; k, v [n, b, hkv, hd] appended to K, V [b, hkv, cap, hd] at `pos`. Query head i
// uses kv head i / (hq / hkv). Returns [n, b, hq · hd].
at::Tensor cachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& K,
                           at::Tensor& V, int64_t pos) {
  const int64_t n = q.size(0), b = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2), len = pos + n;
  K.narrow(2, pos, n).copy_(k.permute({1, 2, 0, 3}));
  V.narrow(2, pos, n).copy_(v.permute({1, 2, 0, 3}));
  auto keys = K.narrow(2, 0, len).unsqueeze(2);  // [b, hkv, 1, len, hd]
  auto values = V.narrow(2, 0, len).unsqueeze(2);
  auto qg = q.permute({1, 2, 0, 3}).reshape({b, hkv, hq / hkv, n, hd});
  auto scores = at::matmul(qg, keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));  // [b, hkv, r, n, len]
  if (n > 1) {  // query i (position pos + i) sees keys 0 .. pos + i
    auto i = at::arange(n, scores.options().dtype(at::kLong)).unsqueeze(1);
    auto j = at::arange(len, scores.options().dtype(at::kLong)).unsqueeze(0);
    scores = scores.masked_fill(j > i + pos, -std::numeric_limits<float>::infinity());
  }
  auto p = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(p, values).reshape({b, hq, n, hd}).permute({2, 0, 1, 3}).reshape({n, b, hq * hd});
}

at::Tensor llamaStep(LlamaBlockImpl& blk, const ModelConfig& c, int tp, const at::Tensor& x, KvCache& cache,
                     size_t layer, int64_t capacity) {
  const int64_t n = x.size(0), b = x.size(1), hd = c.headDim(), lq = c.heads / tp, lkv = localKvHeads(c, tp);
  auto h = blk.wqkv->forward(blk.attnNorm->forward(x));  // [n, b, (lq + 2 lkv) hd]: [q | k | v]
  const auto t = ropeAt(c, c.ropeTheta, c.ropeScaling, cache.length, n, capacity, x.device());
  auto q = nn::applyRope(h.narrow(2, 0, lq * hd).view({n, b, lq, hd}), t);
  auto k = nn::applyRope(h.narrow(2, lq * hd, lkv * hd).view({n, b, lkv, hd}), t);
  auto v = h.narrow(2, (lq + lkv) * hd, lkv * hd).view({n, b, lkv, hd});
  auto y = x + blk.wo->forward(cachedAttention(q, k, v, cache.k[layer], cache.v[layer], cache.length));
  auto g = blk.w13->forward(blk.mlpNorm->forward(y));  // [gate | up]
  const int64_t f = g.size(-1) / 2;
  return y + blk.w2->forward(at::silu(g.narrow(-1, 0, f)) * g.narrow(-1, f, f));
}

at::Tensor gptStep(tp::ParallelBlockImpl& blk, const ModelConfig& c, const at::Tensor& x, KvCache& cache, size_t layer,
                   int64_t capacity) {
  auto& attn = *blk.attn;
  const int64_t n = x.size(0), b = x.size(1), lh = attn.localHeads, hd = attn.headDim;
  auto a = tp::tpLayerNorm(blk.ln1, x, blk.tp, false, blk.fusedNorms);
  auto parts = attn.qkv->forward(a).view({n, b, 3, lh, hd}).unbind(2);
  if (attn.ropeTheta > 0) {
    const auto t = ropeAt(c, attn.ropeTheta, {}, cache.length, n, capacity, x.device());
    parts[0] = nn::applyRope(parts[0], t);
    parts[1] = nn::applyRope(parts[1], t);
  }
  auto y = x + attn.proj->forward(cachedAttention(parts[0], parts[1], parts[2], cache.k[layer], cache.v[layer],
                                                  cache.length));
  return y + blk.mlp->forward(tp::tpLayerNorm(blk.ln2, y, blk.tp, false, blk.fusedNorms));
}

}  // namespace

KvCache makeKvCache(LmChunkImpl& m, int64_t batch, int64_t capacity) {
  checkWhole(m);
  const auto& c = m.cfg;
  TESSERA_CHECK(batch >= 1 && capacity >= 1, "inference: a cache of batch {} and capacity {} (both must be >= 1)",
                batch, capacity);
  TESSERA_CHECK(c.positions != Positions::Learned || capacity <= c.seqLen,
                "inference: {} positions do not fit the model's {} learned positions (--seq-len)", capacity, c.seqLen);
  const auto w = m.emb->weight;
  KvCache cache;
  const auto kvh = localKvHeads(c, m.tp->size());
  for (int i = m.firstBlock; i < m.endBlock; ++i) {
    cache.k.push_back(at::zeros({batch, kvh, capacity, c.headDim()}, w.options()));
    cache.v.push_back(at::zeros({batch, kvh, capacity, c.headDim()}, w.options()));
  }
  return cache;
}

at::Tensor forwardCached(LmChunkImpl& m, const at::Tensor& tokens, KvCache& cache, bool lastOnly) {
  checkWhole(m);
  at::NoGradGuard ng;
  const auto& c = m.cfg;
  TESSERA_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(0) == cache.batch() && tokens.size(1) >= 1,
                "inference: tokens must be [batch {}, n >= 1], got [{}]", cache.batch(),
                tokens.defined() ? c10::str(tokens.sizes()) : "undefined");
  const int64_t n = tokens.size(1), pos = cache.length;
  TESSERA_CHECK(pos + n <= cache.capacity(), "inference: positions {} .. {} are past the cache's capacity {}", pos,
                pos + n - 1, cache.capacity());
  const auto device = m.emb->weight.device();
  auto x = m.emb->forward(tokens.to(device, at::kLong).t().contiguous());  // [n, b, d]
  if (m.pos.defined()) x = x + m.pos.narrow(0, pos, n).unsqueeze(1);
  for (size_t i = 0; i < cache.k.size(); ++i) {
    x = c.arch == Arch::Llama ? llamaStep(*m.llamaBlocks[i], c, m.tp->size(), x, cache, i, cache.capacity())
                              : gptStep(*m.gptBlocks[i], c, x, cache, i, cache.capacity());
  }
  cache.length += n;
  if (lastOnly) x = x.narrow(0, n - 1, 1);
  x = c.arch == Arch::Llama ? m.norm->forward(x) : tp::tpLayerNorm(m.lnf, x, m.tp, false, m.opts.fusedKernels);
  at::Tensor logits;
  if (c.tiedEmbeddings) {
    tp::ParallelLinearOptions ho;
    ho.bias = false;
    ho.name = "head (tied)";
    logits = tp::columnParallelLinear(x, m.tiedTable(), {}, m.tp, ho);
  } else {
    logits = m.head->forward(x);
  }
  return logits.transpose(0, 1).to(at::kFloat).contiguous();  // [b, n, V/tp]
}

}  // namespace tessera::models
