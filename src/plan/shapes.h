#pragma once
// Internal: the per-rank shapes of a model's linears under tensor parallelism, shared by the
// calibration (measure.cpp) and the cost model (compute.cpp). Local; pure.
#include <cstdint>
#include <vector>

#include "tessera/models/config.h"

namespace tessera::plan {

struct LinearShape {
  const char* name;
  int64_t in = 0, out = 0;  // this rank's features (column-parallel: out / tp; row-parallel: in / tp)
  bool block = true;        // a block's linear (FP8 applies); false: the head
  bool bias = false;
};

// Whether the runtime splits this model over tp ranks: heads, kv heads and the MLP divisible.
inline bool tpFits(const models::ModelConfig& m, int tp) {
  return tp >= 1 && m.heads % tp == 0 && m.kvH() % tp == 0 && m.ffnSize() % tp == 0;
}

// qkv, attention output, MLP in (Llama: gate and up fused), MLP out, and the head (vocab / tp,
// rounded up to a multiple of 8 as the runtime pads it).
inline std::vector<LinearShape> linearShapes(const models::ModelConfig& m, int tp) {
  const bool llama = m.arch == models::Arch::Llama;
  const int64_t hd = m.headDim(), q = m.heads * hd, kv = m.kvH() * hd, f = m.ffnSize();
  const int64_t vocab = ((m.vocab + tp - 1) / tp + 7) / 8 * 8;
  return {{"qkv", m.d, (q + 2 * kv) / tp, true, !llama},
          {"attn_out", q / tp, m.d, true, !llama},
          {"mlp_in", m.d, (llama ? 2 : 1) * f / tp, true, !llama},
          {"mlp_out", f / tp, m.d, true, !llama},
          {"head", m.d, vocab, false, false}};
}

}  // namespace tessera::plan
