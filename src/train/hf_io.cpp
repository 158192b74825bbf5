// A run and Hugging Face Llama directories (src/hf): the model of a run without --model,
// --init-from-hf (each rank fills its pieces from the directory's slices before DDP or FSDP take
// the parameters, so every layout starts from the HF weights and no rank reads more than its
// shards), and the exports (the model gathered to rank 0 a tensor at a time; FSDP units
// all-gathered over dp one at a time: DataParallel::exportLookup).
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <map>

#include "hf/config.h"
#include "hf/convert.h"
#include "hf/json_io.h"
#include "hf/llama.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/series.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/hf/safetensors.h"
#include "tessera/models/config_json.h"
#include "train/trainer_state.h"

namespace tessera::train {

std::optional<models::ModelConfig> savedModelConfig(const std::string& initFromHf, const std::string& checkpointDir) {
  // A checkpoint to resume wins over the HF directory it was started from.
  if (const auto found = checkpointDir.empty() ? std::nullopt : checkpoint::find(checkpointDir)) {
    const auto meta = checkpoint::readMetadata(found->dir);
    if (auto it = meta.extra.find("model_config"); it != meta.extra.end()) return models::configFromJson(it->second);
  }
  if (!initFromHf.empty()) return hf::readLlamaConfig(initFromHf);
  return std::nullopt;
}

void Trainer::State::initFromHf(std::vector<models::LmChunk>& chunks) {
  if (!o.checkpoint.dir.empty() && checkpoint::locate(o.checkpoint.dir)) {
    if (isLogger()) {
      log::info("train_gpt: --init-from-hf {}: not read, the run resumes its checkpoint in {}", o.checkpoint.initFromHf,
                o.checkpoint.dir);
    }
    return;
  }
  const auto cfgJson = hf::ConfigJson::read(o.checkpoint.initFromHf);
  const auto fromDir = hf::llamaConfigFromHf(cfgJson);
  TESSERA_CHECK(fromDir.signature() == o.model.cfg.signature(),
                "train_gpt: --init-from-hf {} is of another model than this run:\n  directory: {}\n  this run:  {}",
                o.checkpoint.initFromHf, fromDir.signature(), o.model.cfg.signature());
  const hf::SafetensorsCheckpoint ck(o.checkpoint.initFromHf);
  hf::checkLlamaTensors(ck, o.model.cfg);
  at::NoGradGuard ng;
  for (auto& c : chunks) {
    auto pieces = c->pieces();
    hf::fillLlamaPieces(ck, o.model.cfg, pieces);
  }
  hfConfig = cfgJson.json().dump();
  hfSource = std::filesystem::absolute(o.checkpoint.initFromHf).lexically_normal().string();
  if (isLogger()) {
    log::info(
        "train_gpt: weights from the Hugging Face model {} ({} files): fresh optimizer and schedule, data from "
        "the start",
        o.checkpoint.initFromHf, ck.files().size());
  }
}

void Trainer::State::saveHf(const std::string& dir) {
  at::NoGradGuard ng;
  const auto mine = par.dp->exportLookup([this] { return par.pieces(); });
  std::optional<hf::ConfigJson> base;
  if (!hfConfig.empty())
    base = hf::ConfigJson(hf::parseJson(hfConfig.data(), hfConfig.size(), "hf_config"), "hf_config");
  hf::ConvertOptions co;
  co.dtype = o.checkpoint.saveHfDtype;
  hf::exportLlamaLive(*ctx.world, o.model.cfg, base, hfSource, mine, dir, co);
  if (isLogger()) log::info("train_gpt: model exported to {} (Hugging Face, {})", dir, o.checkpoint.saveHfDtype);
}

}  // namespace tessera::train
