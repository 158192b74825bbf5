#include "tessera/models/generate.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "tessera/models/kv_cache.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::models {

Generation generate(LmChunkImpl& m, const at::Tensor& prompt, const GenerateOptions& o) {
  const auto& c = m.cfg;
  validate(o.sampling);
  TESSERA_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(0) >= 1 && prompt.size(1) >= 1,
                "generate: the prompt must be [batch, n] ids with batch, n >= 1, got [{}]",
                prompt.defined() ? c10::str(prompt.sizes()) : "undefined");
  const auto ids = prompt.to(at::kCPU, at::kLong);
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  TESSERA_CHECK(lo >= 0 && hi < c.vocab, "generate: prompt id {} is outside the vocabulary [0, {})",
                lo < 0 ? lo : hi, c.vocab);
  TESSERA_CHECK(o.maxNewTokens >= 1, "generate: max new tokens must be >= 1, got {}", o.maxNewTokens);
  const int64_t b = ids.size(0), n = ids.size(1);
  TESSERA_CHECK(c.positions != Positions::Learned || n + o.maxNewTokens <= c.seqLen,
                "generate: a prompt of {} tokens + {} new tokens = {} positions: past the model's {} learned positions "
                "(seqLen)",
                n, o.maxNewTokens, n + o.maxNewTokens, c.seqLen);
  TESSERA_CHECK(o.eosId >= -1 && o.eosId < c.vocab, "generate: the EOS id {} is outside the vocabulary [0, {})",
                o.eosId, c.vocab);

  auto cache = makeKvCache(m, b, n + o.maxNewTokens);
  Sampler sampler(o.sampling);
  const bool root = m.tp->rank() == 0;
  Generation g;
  g.tokens.assign(b, {});
  g.stoppedAtEos.assign(b, false);
  auto logits = forwardCached(m, ids, cache);  // [b, 1, V/tp]
  for (int64_t step = 0;; ++step) {
    auto full = tp::gatherLastDim(logits, m.tp).select(1, 0);  // [b, V], the same on every tp rank
    at::Tensor next = root ? sampler.next(full) : at::zeros({b}, at::kLong);
    if (m.tp->size() > 1) {
      auto t = next.to(full.device());
      m.tp->broadcast(t, 0)->wait();
      next = t.to(at::kCPU);
    }
    if (o.keepLogits) g.logits.push_back(full.to(at::kCPU).clone());
    bool running = false;
    for (int64_t r = 0; r < b; ++r) {
      if (g.stoppedAtEos[r]) continue;
      const int64_t id = next[r].item<int64_t>();
      if (id == o.eosId) {
        g.stoppedAtEos[r] = true;
      } else {
        g.tokens[r].push_back(id);
        running = true;
      }
    }
    if (!running || step + 1 == o.maxNewTokens) break;
    logits = forwardCached(m, next.view({b, 1}), cache);
  }
  return g;
}

}  // namespace tessera::models
