// Hugging Face Llama directories <-> tessera checkpoints; see convert.h.
#include "hf/convert.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>

#include "tessera/checkpoint/series.h"
#include "tessera/checkpoint/stream_writer.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "hf/families.h"
#include "hf/json_io.h"
#include "hf/llama.h"
#include "tessera/hf/safetensors.h"
#include "tessera/models/config_json.h"

namespace tessera::hf {

namespace fs = std::filesystem;
using models::ModelConfig;

namespace {

// A log line per `every` tensors (and at the end) with the bytes per second so far.
class Progress {
 public:
  Progress(std::string what, size_t total, int every) : what_(std::move(what)), total_(total), every_(every) {}
  void done(uint64_t bytes) {
    bytes_ += bytes;
    ++n_;
    if (every_ <= 0 || (n_ % static_cast<size_t>(every_) != 0 && n_ != total_)) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    log::info("{}: {}/{} tensors, {:.1f} MB, {:.1f} MB/s", what_, n_, total_, bytes_ / 1e6,
              bytes_ / 1e6 / std::max(s, 1e-9));
  }

 private:
  std::string what_;
  size_t total_, n_ = 0;
  int every_;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

DType exportDType(const ConvertOptions& o) {
  TESSERA_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "tessera hf: --dtype '{}': bf16 or fp32", o.dtype);
  return o.dtype == "bf16" ? DType::BF16 : DType::F32;
}

}  // namespace

std::vector<TensorSpec> exportSpecs(const ModelConfig& c, DType d) {
  std::vector<TensorSpec> out;
  for (const auto& t : tensorMap(c)) {
    for (const auto& h : t.hf) {
      out.push_back({h, d, t.hf.size() == 1 ? t.shape : std::vector<int64_t>(t.shape.begin() + 1, t.shape.end())});
    }
  }
  return out;
}

namespace {

const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                       "tokenizer.model"};

}  // namespace

void writeHfSideFiles(const ModelConfig& c, const std::optional<ConfigJson>& base, const std::string& source,
                      const std::string& hfDir, const ConvertOptions& o) {
  const std::string dtype = exportDType(o) == DType::BF16 ? "bfloat16" : "float32";
  llamaConfigToHf(c, dtype, base).write((fs::path(hfDir) / "config.json").string());
  std::error_code ec;
  const bool haveSource = !source.empty() && fs::is_directory(source, ec) &&
                          !fs::equivalent(source, hfDir, ec);
  const fs::path gen = fs::path(source) / "generation_config.json";
  if (haveSource && fs::is_regular_file(gen, ec)) {
    writeJsonFile((fs::path(hfDir) / "generation_config.json").string(), readJsonFile(gen.string()));
  } else {
    nlohmann::json g = {{"_from_model_config", true}};
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
      if (base && base->json().contains(k)) g[k] = base->json()[k];
    }
    writeJsonFile((fs::path(hfDir) / "generation_config.json").string(), g);
  }
  if (!haveSource) return;
  for (const char* f : kTokenizerFiles) {
    const fs::path from = fs::path(source) / f;
    if (!fs::is_regular_file(from, ec)) continue;
    fs::copy_file(from, fs::path(hfDir) / f, fs::copy_options::overwrite_existing, ec);
    TESSERA_CHECK(!ec, "tessera hf: cannot copy {} into {}: {}", from.string(), hfDir, ec.message());
  }
}

void importLlama(const std::string& hfDir, const std::string& ckptDir, const ConvertOptions& o) {
  // Never over a checkpoint (another model's, or a run's progress): find() also refuses a damaged one.
  if (const auto held = checkpoint::find(ckptDir)) {
    throw Error(fmt::format("tessera hf: {} already holds a checkpoint ({}, step {}): import-hf does not replace it; "
                            "give a new directory, or remove that one first",
                            ckptDir, held->dir, held->step));
  }
  const ConfigJson cfgJson = ConfigJson::read(hfDir);
  const ModelConfig c = llamaConfigFromHf(cfgJson);
  const SafetensorsCheckpoint ck(hfDir);
  checkLlamaTensors(ck, c);
  log::info("tessera-convert: importing {} ({}; {:.1f} MB of tensors in {} files) into {}", hfDir, c.describe(),
            ck.tensorBytes() / 1e6, ck.files().size(), ckptDir);
  checkpoint::StreamWriterOptions wo;
  wo.maxFileBytes = o.checkpointFileBytes;
  // As a run's checkpoints are laid out (checkpoint/series.h): <ckptDir>/step-0 and `latest`.
  const std::string stepDir = checkpoint::stepDir(ckptDir, 0);
  checkpoint::StreamWriter w(stepDir, wo);
  const auto names = tensorMap(c);
  Progress progress("tessera-convert: import", names.size(), o.progressEvery);
  for (const auto& t : names) {
    std::vector<checkpoint::Piece> one{
        {t.name, t.shape, std::vector<int64_t>(t.shape.size(), 0), at::empty(t.shape, at::kFloat)}};
    fillLlamaPieces(ck, c, one);
    w.add(t.name, one[0].local);
    progress.done(static_cast<uint64_t>(one[0].local.numel()) * 4);
  }
  std::error_code ec;
  const auto abs = fs::absolute(hfDir, ec);
  w.finish(0, {{"model", c.signature()},
               {"model_config", models::configToJson(c)},
               {"hf_config", cfgJson.json().dump()},
               {"hf_source", ec ? hfDir : abs.lexically_normal().string()},
               {"weights_only", "true"},
               {"layout", "tessera-convert import-hf (whole tensors)"}});
  checkpoint::commitStep(ckptDir, 0, 0);
  log::info("tessera-convert: wrote {} (step 0, {} tensors in {} files)", stepDir, names.size(), w.files());
}

void exportLlama(const std::string& ckptDir, const std::string& hfDir, const ConvertOptions& o) {
  checkpoint::Reader r(ckptDir);
  const auto& extra = r.metadata().extra;
  const auto it = extra.find("model_config");
  TESSERA_CHECK(it != extra.end(),
                "tessera hf: the checkpoint {} holds no model configuration (saved by an older tessera): cannot export "
                "it",
                r.dir());
  const ModelConfig c = models::configFromJson(it->second);
  try {
    familyOf(c);
  } catch (const Error& e) {
    throw Error(fmt::format("tessera hf: the checkpoint {} cannot be exported: {}", r.dir(), e.what()));
  }
  std::optional<ConfigJson> base;
  if (auto b = extra.find("hf_config"); b != extra.end()) {
    base = ConfigJson(parseJson(b->second.data(), b->second.size(), r.dir() + ": hf_config"), r.dir() + ": hf_config");
  }
  const auto source = extra.count("hf_source") ? extra.at("hf_source") : std::string();
  const DType d = exportDType(o);
  WriteOptions wo;
  wo.maxShardBytes = o.maxShardBytes;
  const auto specs = exportSpecs(c, d);
  CheckpointWriter w(hfDir, specs, {}, wo);
  log::info("tessera-convert: exporting {} (step {}; {}) to {} as {}", r.dir(), r.metadata().step, c.describe(),
            hfDir, o.dtype);
  Progress progress("tessera-convert: export", specs.size(), o.progressEvery);
  for (const auto& n : tensorMap(c)) {
    if (n.hf.empty()) continue;  // the selection bias: zero (familyOf refuses a model that moves it)
    const auto t = r.read(n.name).to(scalarType(d));
    for (size_t k = 0; k < n.hf.size(); ++k) {
      const auto one = n.hf.size() == 1 ? t : t[static_cast<int64_t>(k)];
      w.write(n.hf[k], one);
      progress.done(static_cast<uint64_t>(one.numel()) * one.element_size());
    }
  }
  const auto files = w.finish();
  writeHfSideFiles(c, base, source, hfDir, o);
  log::info("tessera-convert: wrote {} ({} tensors in {})", hfDir, specs.size(), fmt::join(files, ", "));
}

}  // namespace tessera::hf
