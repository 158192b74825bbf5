// train_gpt and Hugging Face Llama directories (src/hf): the model of a run without --model,
// --init-from-hf (each rank fills its pieces from the directory's slices before DDP or FSDP take
// the parameters, so every layout starts from the HF weights and no rank reads more than its
// shards), and --save-hf-every / --save-hf-at-end (the model gathered to rank 0 a tensor at a
// time; FSDP units all-gathered over dp one at a time).
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "hf/config.h"
#include "hf/convert.h"
#include "hf/json_io.h"
#include "hf/llama.h"
#include "hf/safetensors.h"
#include "models/config_json.h"
#include "trainer_state.h"

namespace tessera::gpt {

std::optional<models::ModelConfig> savedModelConfig(const std::string& initFromHf, const std::string& checkpointDir) {
  // A checkpoint to resume wins over the HF directory it was started from.
  if (!checkpointDir.empty() && checkpoint::locate(checkpointDir)) {
    const auto meta = checkpoint::readMetadata(checkpointDir);
    if (auto it = meta.extra.find("model_config"); it != meta.extra.end()) return models::configFromJson(it->second);
  }
  if (!initFromHf.empty()) return hf::readLlamaConfig(initFromHf);
  return std::nullopt;
}

void Trainer::State::initFromHf() {
  if (!o.checkpointDir.empty() && checkpoint::locate(o.checkpointDir)) {
    if (isLogger()) {
      log::info("train_gpt: --init-from-hf {}: not read, the run resumes its checkpoint in {}", o.initFromHf,
                o.checkpointDir);
    }
    return;
  }
  const auto cfgJson = hf::ConfigJson::read(o.initFromHf);
  const auto fromDir = hf::llamaConfigFromHf(cfgJson);
  TESSERA_CHECK(fromDir.signature() == o.cfg.signature(),
                "train_gpt: --init-from-hf {} is of another model than this run:\n  directory: {}\n  this run:  {}",
                o.initFromHf, fromDir.signature(), o.cfg.signature());
  const hf::SafetensorsCheckpoint ck(o.initFromHf);
  hf::checkLlamaTensors(ck, o.cfg);
  at::NoGradGuard ng;
  for (auto& c : chunks) {
    auto pieces = c->pieces();
    hf::fillLlamaPieces(ck, pieces);
  }
  hfConfig = cfgJson.json().dump();
  hfSource = std::filesystem::absolute(o.initFromHf).lexically_normal().string();
  if (isLogger()) {
    log::info("train_gpt: weights from the Hugging Face model {} ({} files): fresh optimizer and schedule, data from "
              "the start",
              o.initFromHf, ck.files().size());
  }
}

namespace {
// FSDP's resharded parameters keep their sizes over a storage of 0 bytes, and LibTorch checks
// views against their storage: while alive, each such storage says the bytes its parameters
// span (the data pointer stays null: nothing is allocated or touched), so pieces() can take
// views whose sizes, strides and offsets locate the values in the unit's flat buffer.
class SizedStorages {
 public:
  explicit SizedStorages(const std::vector<ChunkParam>& ps) {
    std::map<c10::StorageImpl*, size_t> need;
    for (const auto& p : ps) {
      auto* s = p.tensor.storage().unsafeGetStorageImpl();
      if (s->nbytes() > 0) continue;  // gathered
      auto& n = need[s];
      n = std::max(n, static_cast<size_t>(p.tensor.storage_offset() + p.tensor.numel()) * p.tensor.element_size());
    }
    for (const auto& [s, n] : need) {
      s->set_nbytes(n);
      sized_.push_back(s);
    }
  }
  ~SizedStorages() { restore(); }
  void restore() {
    for (auto* s : sized_) s->set_nbytes(0);
    sized_.clear();
  }

 private:
  std::vector<c10::StorageImpl*> sized_;
};
}  // namespace

void Trainer::State::saveHf(const std::string& dir) {
  at::NoGradGuard ng;
  const auto ps = params();
  // This rank's pieces by name, and (FSDP) the parameter each is a view of: its values live in
  // the unit's flat shard, gathered when a tensor of the unit is asked for.
  std::map<std::string, std::vector<std::pair<checkpoint::Piece, size_t>>> byName;
  SizedStorages sized(fsdp ? ps : std::vector<ChunkParam>{});
  for (auto& c : chunks) {
    for (auto& p : c->pieces()) {
      size_t k = 0;
      const int64_t off = p.local.storage_offset();
      while (k < ps.size() && !(p.local.is_alias_of(ps[k].tensor) && off >= ps[k].tensor.storage_offset() &&
                                off < ps[k].tensor.storage_offset() + ps[k].tensor.numel())) {
        ++k;
      }
      TESSERA_CHECK(k < ps.size(), "train_gpt: HF export: piece '{}' is no parameter's view", p.name);
      byName[p.name].emplace_back(p, k);
    }
  }
  sized.restore();
  std::map<std::string, std::pair<size_t, int64_t>> where;  // FSDP: parameter -> (unit, offset in its flat buffer)
  if (fsdp) {
    for (size_t u = 0; u < fsdp->numUnits(); ++u) {
      for (const auto& e : fsdp->layout(u).entries) where[e.name] = {u, e.offset};
    }
  }
  size_t gatheredUnit = SIZE_MAX;
  at::Tensor gathered;  // that unit's full fp32 flat buffer
  auto mine = [&](const std::string& name) {
    std::vector<checkpoint::Piece> out;
    auto it = byName.find(name);
    if (it == byName.end()) return out;
    for (const auto& [piece, k] : it->second) {
      if (!fsdp) {
        out.push_back(piece);
        continue;
      }
      const auto [u, offset] = where.at(ps[k].name);
      if (u != gatheredUnit) {  // collective over dp: every dp rank of this stage asks for the same tensors
        const auto& lay = fsdp->layout(u);
        gathered = at::zeros({lay.paddedNumel}, fsdp->masterShard(u).options());
        auto shard = at::zeros({lay.shardNumel}, gathered.options());
        shard.narrow(0, 0, fsdp->masterShard(u).numel()).copy_(fsdp->masterShard(u));
        if (fsdp->shardGroup()->size() == 1) {
          gathered.copy_(shard);
        } else {
          fsdp->shardGroup()->allGather(gathered, shard)->wait();
        }
        gatheredUnit = u;
      }
      const auto& P = ps[k].tensor;
      const auto& l = piece.local;
      out.push_back({piece.name, piece.globalShape, piece.offset,
                     gathered.as_strided(l.sizes(), l.strides(),
                                         gathered.storage_offset() + offset + (l.storage_offset() - P.storage_offset()))});
    }
    return out;
  };
  std::optional<hf::ConfigJson> base;
  if (!hfConfig.empty()) base = hf::ConfigJson(hf::parseJson(hfConfig.data(), hfConfig.size(), "hf_config"), "hf_config");
  hf::ConvertOptions co;
  co.dtype = o.saveHfDtype;
  hf::exportLlamaLive(*ctx.world, o.cfg, base, hfSource, mine, dir, co);
  if (isLogger()) log::info("train_gpt: model exported to {} (Hugging Face, {})", dir, o.saveHfDtype);
}

}  // namespace tessera::gpt
