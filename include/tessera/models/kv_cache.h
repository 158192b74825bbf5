#pragma once
// Inference with a key/value cache over a whole model (a pp = 1 LmChunk, any family, any tp):
// the prompt runs once (prefill), then each new token costs one position. Each block keeps the
// keys and values of this rank's kv heads (GQA: the kv heads, not repeated for the query heads;
// a kv head replicated over tp ranks is kept on each of them), rotary positions offset by the
// cached length. The blocks' training weights are used as they are (BlockImpl::decode); the
// training forward is not touched. Attention is the math path softmax(q Kᵀ / sqrt(hd) + causal
// mask) V. No autograd; collective over the chunk's tp group like its forward.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/models/lm.h"
#include "tessera/nn/rope.h"

namespace tessera::models {

struct KvCache {
  std::vector<at::Tensor> k, v;  // per block: [batch, local kv heads, capacity, head dim]
  int64_t length = 0;            // positions filled: the next token's position
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(2); }
  int64_t batch() const { return k.empty() ? 0 : k[0].size(0); }
};

// An empty cache for `batch` sequences of up to `capacity` positions, in the dtype and on the
// device of the chunk's weights. Local. The chunk must hold the whole model (pp = 1: first and
// last stage) without sequence parallel; learned positions limit capacity to the model's seqLen;
// else a tessera::Error naming the numbers.
KvCache makeKvCache(LmChunkImpl& chunk, int64_t batch, int64_t capacity);

// Runs tokens [batch, n] (int64, any device; ids in [0, vocab)) at positions [cache.length,
// cache.length + n) and appends their keys and values to `cache`. Returns this rank's vocab shard
// of the logits, [batch, n, vocab/tp] (lastOnly: [batch, 1, vocab/tp], the last position's only:
// the head runs on one position), float32 on the chunk's device. A batch other than the cache's,
// or positions past its capacity → tessera::Error.
at::Tensor forwardCached(LmChunkImpl& chunk, const at::Tensor& tokens, KvCache& cache, bool lastOnly = true);

// For the families' decode. The rotary tables' rows of the n positions from cache.length:
nn::RopeTables cachedRope(const ModelConfig& c, double theta, const nn::RopeScaling& s, const KvCache& cache,
                          int64_t n, at::Device device);
// q [n, b, hq, hd]; k, v [n, b, hkv, hd] appended to block `layer`'s cache at cache.length. Query
// head i uses kv head i / (hq / hkv). Returns [n, b, hq · hd].
at::Tensor cachedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, KvCache& cache,
                           size_t layer);

}  // namespace tessera::models
