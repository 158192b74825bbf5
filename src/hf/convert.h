#pragma once
// Hugging Face directories of the Llama families (hf/families.h) <-> tessera checkpoints
// (tessera-convert import-hf / export-hf), and the export of a running model (train_gpt --save-hf-*).
//
// An HF directory (written by export, read by import): config.json (hf/llama.h), the weights as
// model.safetensors or model-0000k-of-0000n.safetensors + model.safetensors.index.json,
// generation_config.json (copied from the imported model when it had one, else minimal), and the
// imported model's tokenizer files (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model), copied when its directory is still there.
// A checkpoint written by import: step 0, whole float32 tensors under tessera's names in
// shard files of about 1 GiB, and in its extra "model" (the signature), "model_config"
// (config_json.h), "hf_config" (the imported config.json, so export keeps its other fields),
// "hf_source" (the directory imported), "weights_only": "true" (no optimizer state, no data
// position: train_gpt starts its optimizer and data afresh from it).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "hf/config.h"
#include "tessera/hf/safetensors.h"
#include "tessera/models/config.h"

namespace tessera::hf {

struct ConvertOptions {
  std::string dtype = "bf16";                         // export: "bf16" | "fp32"
  uint64_t maxShardBytes = 5'000'000'000;             // export: bytes per safetensors file
  uint64_t checkpointFileBytes = 1ull << 30;          // import: bytes per tessera shard file
  int progressEvery = 32;                             // a log line per this many tensors
};

// Local, one process. Reads `hfDir` (config and every tensor checked first: llama.h) and writes
// the checkpoint at `ckptDir` a tensor at a time (memory: about 2 x checkpointFileBytes).
// Errors name the file, tensor and field.
void importLlama(const std::string& hfDir, const std::string& ckptDir, const ConvertOptions& o = {});

// Local, one process. Writes the model of the checkpoint at `ckptDir` (any saved layout; it must
// hold "model_config" of a Llama) to `hfDir` a tensor at a time: memory holds one tensor in
// float32 and its converted copy (checkpoint::Reader maps the shard files).
void exportLlama(const std::string& ckptDir, const std::string& hfDir, const ConvertOptions& o = {});

// This rank's pieces of tensor `name` (tessera name; views of its values, any device). Called
// for every tensor with an HF name in llamaTensorNames order on every rank; it may run collectives of a group
// whose ranks all hold pieces of `name` (FSDP: the unit's all-gather over dp).
using PieceSource = std::function<std::vector<checkpoint::Piece>(const std::string& name)>;

// Collective over `world` (every rank, the same arguments): each tensor is gathered to rank 0
// from the ranks holding its boxes (the lowest rank holding a box sends it), converted and
// written by rank 0 into `hfDir` with the files above. Memory on rank 0: one tensor (float32
// and converted). `base`: the imported model's config.json; `source`: the directory to copy
// tokenizer files from (empty: none). Errors (boxes that do not cover a tensor, more than two
// pieces of a tensor on a rank) are raised on every rank alike.
void exportLlamaLive(Communicator& world, const models::ModelConfig& c, const std::optional<ConfigJson>& base,
                     const std::string& source, const PieceSource& mine, const std::string& hfDir,
                     const ConvertOptions& o = {});

// config.json, generation_config.json and the tokenizer files of `source` (if any) into
// `hfDir` (local; what both exports write beside the weights).
void writeHfSideFiles(const models::ModelConfig& c, const std::optional<ConfigJson>& base, const std::string& source,
                      const std::string& hfDir, const ConvertOptions& o);
// The HF tensors of the model in the order the exports write them (an expert tensor's experts in
// order), in dtype `d`.
std::vector<TensorSpec> exportSpecs(const models::ModelConfig& c, DType d);

}  // namespace tessera::hf
