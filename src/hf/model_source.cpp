#include "tessera/hf/model_source.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "tessera/checkpoint/series.h"
#include "tessera/common/error.h"
#include "hf/llama.h"
#include "tessera/hf/safetensors.h"
#include "tessera/models/config_json.h"

namespace tessera::hf {

namespace fs = std::filesystem;
using namespace models;

namespace {

ModelSource openTessera(const std::string& dir, const std::optional<ModelConfig>& flags) {
  const auto meta = checkpoint::readMetadata(dir);
  ModelSource s;
  s.dir = dir;
  s.format = "tessera";
  const auto cfg = meta.extra.find("model_config");
  const auto sig = meta.extra.find("model");
  if (flags) {
    s.config = *flags;
    TESSERA_CHECK(sig == meta.extra.end() || sig->second == flags->signature(),
                  "model {}: the checkpoint is of another model than the flags give:\n  checkpoint: {}\n"
                  "  flags:      {}",
                  dir, sig->second, flags->signature());
  } else {
    TESSERA_CHECK(cfg != meta.extra.end(),
                  "model {}: the checkpoint holds no model configuration (saved by an older tessera{}): pass the model "
                  "flags (--model PRESET and shape flags such as --seq-len, as train_gpt was given)",
                  dir, sig != meta.extra.end() ? fmt::format("; it was: {}", sig->second) : "");
    try {
      s.config = configFromJson(cfg->second);
    } catch (const Error& e) {
      throw Error(fmt::format("model {}: its model_config: {}", dir, e.what()));
    }
  }
  s.describe = fmt::format("tessera checkpoint {} (step {}, saved by {} ranks{})", dir, meta.step, meta.world,
                           meta.extra.count("layout") ? ": " + meta.extra.at("layout") : "");
  s.fill = [dir](std::vector<checkpoint::Piece>& pieces) { checkpoint::load(dir, pieces); };
  return s;
}

// A Hugging Face Llama directory: config.json through hf/llama.h, the weights sliced from its
// mapped safetensors files.
ModelSource openHf(const std::string& dir, const std::optional<ModelConfig>& flags) {
  ModelSource s;
  s.dir = dir;
  s.format = "hf";
  const ModelConfig fromDir = hf::readLlamaConfig(dir);
  s.config = fromDir;
  if (flags) {
    TESSERA_CHECK(flags->signature() == fromDir.signature(),
                  "model {}: the Hugging Face model is of another model than the flags give:\n  directory: {}\n"
                  "  flags:     {}",
                  dir, fromDir.signature(), flags->signature());
    s.config = *flags;
  }
  auto ck = std::make_shared<hf::SafetensorsCheckpoint>(dir);
  hf::checkLlamaTensors(*ck, s.config);
  s.describe = fmt::format("Hugging Face model {} ({} safetensors files)", dir, ck->files().size());
  s.fill = [ck, cfg = s.config](std::vector<checkpoint::Piece>& pieces) { hf::fillLlamaPieces(*ck, cfg, pieces); };
  return s;
}

}  // namespace

ModelSource openModel(const std::string& dir, const std::optional<ModelConfig>& flags) {
  const fs::path p(dir);
  // A tessera checkpoint: a run's directory (its newest complete step-<N>), one checkpoint, or .old.
  if (const auto found = checkpoint::find(dir)) return openTessera(found->dir, flags);
  TESSERA_CHECK(fs::is_directory(p), "model {}: no such directory", dir);
  if (fs::exists(p / "config.json")) return openHf(dir, flags);
  throw Error(fmt::format(
      "model {}: no model there (neither metadata.pt of a tessera checkpoint nor config.json of a Hugging Face model)",
      dir));
}

LmChunk loadWholeModel(const ModelSource& s, const CommPtr& tp, at::Device device) {
  const auto& c = s.config;
  TESSERA_CHECK(c.vocab % tp->size() == 0 && c.heads % tp->size() == 0 && c.ffnSize() % tp->size() == 0,
                "model {}: vocab {}, heads {} and FFN {} must be divisible by tp = {}", s.dir, c.vocab, c.heads,
                c.ffnSize(), tp->size());
  auto chunk = LmChunk(c, tp, familyGroup(c, tp), ChunkRange::whole(c), LayerOptions{});
  chunk->to(device);
  chunk->eval();
  at::NoGradGuard ng;
  auto pieces = chunk->pieces();
  s.fill(pieces);
  return chunk;
}

}  // namespace tessera::hf
