#pragma once
// Where a model to run comes from: given MODEL_DIR, its ModelConfig and a way to fill a chunk's
// parameters (the one hook tools such as tessera_generate open a model through).
//   - a tessera checkpoint (metadata.pt): the config from its metadata extra "model_config"
//     (config_json.h), the weights through checkpoint::load (any saved dp/pp/tp layout);
//   - a Hugging Face Llama directory (config.json + safetensors): the config through
//     hf/llama.h (its refusals name the field), the weights sliced from the mapped files (each
//     rank reads only its shards' bytes).
// openModel is local: every rank opens the directory itself.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"
#include "tessera/models/lm.h"

namespace tessera::hf {

using models::LmChunk;
using models::ModelConfig;

struct ModelSource {
  std::string dir;
  std::string format;  // "tessera" | "hf"
  ModelConfig config;
  std::string describe;  // one line for logs: format, step, how it was saved
  // Fills each piece's `local` in place with its box of the unsharded tensor of that name
  // (LmChunkImpl::pieces(): "emb.weight", "blocks.0.wq.weight", ...). Local; a missing tensor or
  // a shape that differs → tessera::Error naming it.
  std::function<void(std::vector<checkpoint::Piece>&)> fill;
};

// Opens `dir`. `flags`: the model given on the command line (--model and shape flags); it wins
// over the directory's config, but must have the signature (ModelConfig::signature) the
// checkpoint was saved with. A tessera checkpoint without "model_config" (older tessera) needs
// `flags`. No model at `dir`, a config tessera cannot express, a signature mismatch → tessera::Error naming
// the directory and what to do.
ModelSource openModel(const std::string& dir, const std::optional<ModelConfig>& flags = std::nullopt);

// The whole model (pp = 1) over `tp` on `device`, its parameters filled from `s`: this rank's
// tp shards of every tensor. Collective over tp (Llama's kv group is split from it); shapes that
// do not fit tp → tessera::Error naming the numbers.
LmChunk loadWholeModel(const ModelSource& s, const CommPtr& tp, at::Device device);

}  // namespace tessera::hf
