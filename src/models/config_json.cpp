#include "tessera/models/config_json.h"

#include <nlohmann/json.hpp>

#include <set>

#include "tessera/common/error.h"

namespace tessera::models {

using nlohmann::json;

std::string configToJson(const ModelConfig& c) {
  json j = json::object();
  j["arch"] = toString(c.arch);
  j["d"] = c.d;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["kvHeads"] = c.kvHeads;
  j["ffn"] = c.ffn;
  j["vocab"] = c.vocab;
  j["seqLen"] = c.seqLen;
  j["positions"] = toString(c.positions);
  j["ropeTheta"] = c.ropeTheta;
  if (c.ropeScaling.enabled) {
    const auto& s = c.ropeScaling;
    j["ropeScaling"] = {{"factor", s.factor},
                        {"lowFreqFactor", s.lowFreqFactor},
                        {"highFreqFactor", s.highFreqFactor},
                        {"originalMaxPositions", s.originalMaxPositions}};
  } else {
    j["ropeScaling"] = nullptr;
  }
  j["tiedEmbeddings"] = c.tiedEmbeddings;
  j["normEps"] = c.normEps;
  if (c.headSize > 0) j["headSize"] = c.headSize;
  if (c.qkNorm != QkNorm::None) j["qkNorm"] = toString(c.qkNorm);
  if (c.moe.experts > 0) {
    const auto& m = c.moe;
    j["moe"] = {{"experts", m.experts},       {"topK", m.topK},
                {"expertFfn", m.expertFfn},   {"sharedFfn", m.sharedFfn},
                {"score", toString(m.score)}, {"normTopK", m.normTopK},
                {"routedScale", m.routedScale}, {"capacityFactor", m.capacityFactor},
                {"auxLossCoef", m.auxLossCoef}, {"zLossCoef", m.zLossCoef},
                {"biasUpdateRate", m.biasUpdateRate}, {"firstDense", m.firstDense},
                {"sparseStep", m.sparseStep}, {"denseLayers", m.denseLayers}};
  }
  return j.dump();
}

namespace {

// j[key] read as T (integer, number, bool or string) into `out`; absent: `out` kept unless required.
template <typename T>
void read(const json& j, const char* key, T& out, bool required, const char* where) {
  const auto it = j.find(key);
  if (it == j.end()) {
    TESSERA_CHECK(!required, "model config JSON: {}field '{}' is missing", where, key);
    return;
  }
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = it->is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer();
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = it->is_number();
  } else {
    ok = it->is_string();
  }
  TESSERA_CHECK(ok, "model config JSON: {}field '{}' has the wrong type: {}", where, key, it->dump());
  out = it->get<T>();
}

void onlyKnown(const json& j, const std::set<std::string>& known, const char* where) {
  for (const auto& [k, v] : j.items()) {
    TESSERA_CHECK(known.count(k), "model config JSON: unknown {}field '{}'", where, k);
  }
}

// The "moe" object (configToJson's) into c.moe.
void readMoe(const json& j, MoeConfig& m) {
  TESSERA_CHECK(j.is_object(), "model config JSON: field 'moe' must be an object, got {}", j.dump());
  onlyKnown(j,
            {"experts", "topK", "expertFfn", "sharedFfn", "score", "normTopK", "routedScale", "capacityFactor",
             "auxLossCoef", "zLossCoef", "biasUpdateRate", "firstDense", "sparseStep", "denseLayers"},
            "moe ");
  std::string score = toString(m.score);
  read(j, "experts", m.experts, true, "moe ");
  read(j, "topK", m.topK, true, "moe ");
  read(j, "expertFfn", m.expertFfn, false, "moe ");
  read(j, "sharedFfn", m.sharedFfn, false, "moe ");
  read(j, "score", score, false, "moe ");
  m.score = parseRouterScore(score);
  read(j, "normTopK", m.normTopK, false, "moe ");
  read(j, "routedScale", m.routedScale, false, "moe ");
  read(j, "capacityFactor", m.capacityFactor, false, "moe ");
  read(j, "auxLossCoef", m.auxLossCoef, false, "moe ");
  read(j, "zLossCoef", m.zLossCoef, false, "moe ");
  read(j, "biasUpdateRate", m.biasUpdateRate, false, "moe ");
  read(j, "firstDense", m.firstDense, false, "moe ");
  read(j, "sparseStep", m.sparseStep, false, "moe ");
  if (const auto it = j.find("denseLayers"); it != j.end()) {
    TESSERA_CHECK(it->is_array(), "model config JSON: field 'moe denseLayers' must be an array, got {}", it->dump());
    for (const auto& l : *it) {
      TESSERA_CHECK(l.is_number_integer(), "model config JSON: field 'moe denseLayers' holds {}", l.dump());
      m.denseLayers.push_back(l.get<int64_t>());
    }
  }
}

}  // namespace

ModelConfig configFromJson(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("model config JSON: not JSON ({}): '{}'", e.what(), text.substr(0, 200)));
  }
  TESSERA_CHECK(j.is_object(), "model config JSON: expected an object, got '{}'", text.substr(0, 200));
  onlyKnown(j,
            {"arch", "d", "layers", "heads", "kvHeads", "ffn", "vocab", "seqLen", "positions", "ropeTheta",
             "ropeScaling", "tiedEmbeddings", "normEps", "headSize", "qkNorm", "moe"},
            "");
  ModelConfig c;
  std::string arch, positions;
  read(j, "arch", arch, true, "");
  TESSERA_CHECK(arch == "gpt" || arch == "llama", "model config JSON: field 'arch' is '{}' (allowed: gpt, llama)",
                arch);
  c.arch = arch == "gpt" ? Arch::Gpt : Arch::Llama;
  read(j, "d", c.d, true, "");
  read(j, "layers", c.layers, true, "");
  read(j, "heads", c.heads, true, "");
  read(j, "kvHeads", c.kvHeads, false, "");
  read(j, "ffn", c.ffn, false, "");
  read(j, "vocab", c.vocab, true, "");
  read(j, "seqLen", c.seqLen, true, "");
  read(j, "positions", positions, true, "");
  c.positions = parsePositions(positions);
  read(j, "ropeTheta", c.ropeTheta, false, "");
  if (const auto it = j.find("ropeScaling"); it != j.end() && !it->is_null()) {
    TESSERA_CHECK(it->is_object(), "model config JSON: field 'ropeScaling' must be null or an object, got {}",
                  it->dump());
    auto& s = c.ropeScaling;
    s.enabled = true;
    onlyKnown(*it, {"factor", "lowFreqFactor", "highFreqFactor", "originalMaxPositions"}, "ropeScaling ");
    read(*it, "factor", s.factor, true, "ropeScaling ");
    read(*it, "lowFreqFactor", s.lowFreqFactor, true, "ropeScaling ");
    read(*it, "highFreqFactor", s.highFreqFactor, true, "ropeScaling ");
    read(*it, "originalMaxPositions", s.originalMaxPositions, true, "ropeScaling ");
  }
  read(j, "tiedEmbeddings", c.tiedEmbeddings, false, "");
  read(j, "normEps", c.normEps, false, "");
  read(j, "headSize", c.headSize, false, "");
  std::string qk = "none";
  read(j, "qkNorm", qk, false, "");
  c.qkNorm = parseQkNorm(qk);
  if (const auto it = j.find("moe"); it != j.end()) readMoe(*it, c.moe);
  validate(c);
  return c;
}

}  // namespace tessera::models
