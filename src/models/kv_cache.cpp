#include "tessera/models/kv_cache.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "tessera/common/error.h"

namespace tessera::models {

namespace {
void checkWhole(const LmChunkImpl& m) {
  TESSERA_CHECK(m.first && m.last,
                "inference: the chunk holds stage {} only: inference runs a whole model (pp = 1; pipeline inference "
                "is not supported)",
                m.range.stage);
  TESSERA_CHECK(!m.opts.sequenceParallel, "inference: build the model without sequence parallel");
}
}  // namespace

nn::RopeTables cachedRope(const ModelConfig& c, double theta, const nn::RopeScaling& s, const KvCache& cache,
                          int64_t n, at::Device device) {
  const auto t = nn::ropeTables(std::max(cache.capacity(), c.seqLen), c.headDim(), theta, s, device);
  return {t.cos.narrow(0, cache.length, n), t.sin.narrow(0, cache.length, n)};
}

at::Tensor cachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, KvCache& cache,
                           size_t layer) {
  auto& K = cache.k[layer];
  auto& V = cache.v[layer];
  const int64_t pos = cache.length;
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

KvCache makeKvCache(LmChunkImpl& m, int64_t batch, int64_t capacity) {
  checkWhole(m);
  const auto& c = m.cfg;
  TESSERA_CHECK(batch >= 1 && capacity >= 1, "inference: a cache of batch {} and capacity {} (both must be >= 1)",
                batch, capacity);
  TESSERA_CHECK(c.positions != Positions::Learned || capacity <= c.seqLen,
                "inference: {} positions do not fit the model's {} learned positions (--seq-len)", capacity, c.seqLen);
  const auto w = m.emb->weight;
  KvCache cache;
  for (const auto& b : m.blocks) {
    cache.k.push_back(at::zeros({batch, b->localKvHeads(), capacity, c.headDim()}, w.options()));
    cache.v.push_back(at::zeros({batch, b->localKvHeads(), capacity, c.headDim()}, w.options()));
  }
  return cache;
}

at::Tensor forwardCached(LmChunkImpl& m, const at::Tensor& tokens, KvCache& cache, bool lastOnly) {
  checkWhole(m);
  at::NoGradGuard ng;
  TESSERA_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(0) == cache.batch() && tokens.size(1) >= 1,
                "inference: tokens must be [batch {}, n >= 1], got [{}]", cache.batch(),
                tokens.defined() ? c10::str(tokens.sizes()) : "undefined");
  const int64_t n = tokens.size(1), pos = cache.length;
  TESSERA_CHECK(pos + n <= cache.capacity(), "inference: positions {} .. {} are past the cache's capacity {}", pos,
                pos + n - 1, cache.capacity());
  const auto device = m.emb->weight.device();
  auto x = m.emb->forward(tokens.to(device, at::kLong).t().contiguous());  // [n, b, d]
  if (m.pos.defined()) x = x + m.pos.narrow(0, pos, n).unsqueeze(1);
  for (size_t i = 0; i < m.blocks.size(); ++i) x = m.blocks[i]->decode(x, cache, i);
  cache.length += n;
  if (lastOnly) x = x.narrow(0, n - 1, 1);
  return m.logits(m.norm->forward(x)).transpose(0, 1).to(at::kFloat).contiguous();  // [b, n, V/tp]
}

}  // namespace tessera::models
