#pragma once
// A ModelConfig as JSON, so that a checkpoint rebuilds its model alone (train_gpt writes it into
// every checkpoint's metadata extra as "model_config"; tessera_generate reads it back). Every
// field, under its name in ModelConfig:
//   {"arch": "llama", "d": 64, "layers": 4, "heads": 4, "kvHeads": 2, "ffn": 192, "vocab": 4096,
//    "seqLen": 64, "positions": "rope", "ropeTheta": 10000, "ropeScaling": null, "tiedEmbeddings":
//    true, "normEps": 1e-05}
// ropeScaling is null when disabled, else {"factor", "lowFreqFactor", "highFreqFactor",
// "originalMaxPositions"}. Written only when set: "headSize", "qkNorm" ("per-head" | "whole") and
// "moe" (MoeConfig's fields by name; "score" as "softmax" | "sigmoid"). Numbers round-trip exactly.
// Local; pure functions.
#include <string>

#include "tessera/models/config.h"

namespace tessera::models {

// One line of JSON.
std::string configToJson(const ModelConfig& c);
// The inverse. arch, d, layers, heads, vocab, seqLen and positions are required; the other fields
// default to ModelConfig's. Not JSON, a missing required field, an unknown field, a value of the
// wrong type or a config that fails validate() → tessera::Error naming the field and the value.
ModelConfig configFromJson(const std::string& json);

}  // namespace tessera::models
