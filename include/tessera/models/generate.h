#pragma once
// Text generation from a whole model (a pp = 1 LmChunk, GPT or Llama, any tp): the prompts run
// once through the model (prefill, kv_cache.h), then each new token costs one position; the
// token is picked from the full logits (the vocab shards gathered over tp) by a Sampler
// (sample.h) on tp rank 0 and broadcast, so every tp rank continues with the same token.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/models/lm.h"
#include "tessera/models/sample.h"

namespace tessera::models {

struct GenerateOptions {
  int64_t maxNewTokens = 32;
  SamplingOptions sampling;
  int64_t eosId = -1;       // a sequence ends when it draws this id (not kept in its tokens); -1: none
  bool keepLogits = false;  // Generation::logits: the full logits of every step (tests)
};

struct Generation {
  std::vector<std::vector<int64_t>> tokens;  // per prompt row: the new tokens
  std::vector<bool> stoppedAtEos;            // per prompt row
  std::vector<at::Tensor> logits;            // keepLogits: step s's logits [batch, vocab], float32 CPU
};

// Continues every row of `prompt` [batch, n] (int64, any device) by up to maxNewTokens tokens.
// Collective over chunk.tp: every tp rank calls it with the same prompt and options, and all
// return the same Generation. Checked before any work (tessera::Error naming the value): ids
// outside [0, vocab), maxNewTokens < 1, a prompt plus maxNewTokens past the model's seqLen with
// learned positions (rotary or no positions may run past it), bad sampling options, pp > 1.
Generation generate(LmChunkImpl& chunk, const at::Tensor& prompt, const GenerateOptions& o);

}  // namespace tessera::models
