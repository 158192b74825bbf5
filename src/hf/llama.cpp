// The Hugging Face Llama mapping; see llama.h.
#include "hf/llama.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <regex>
#include <set>

#include "hf/families.h"
#include "tessera/common/error.h"

namespace tessera::hf {

using models::ModelConfig;

namespace {

// rope_scaling (or transformers 5's rope_parameters) -> the scaling; null / "default": none.
void readRope(const ConfigJson& c, ModelConfig& m) {
  const bool v5 = c.has("rope_parameters");
  const char* key = v5 ? "rope_parameters" : "rope_scaling";
  if (!c.has(key)) return;
  const ConfigJson r = c.getObject(key);
  if (v5) m.ropeTheta = r.getDouble("rope_theta", m.ropeTheta);
  const std::string type = r.has("rope_type") ? r.getString("rope_type") : r.getString("type", "default");
  if (type == "default") return;
  TESSERA_CHECK(type == "llama3",
                "tessera hf: '{}': {}.rope_type is '{}': tessera's Llama has the default rotary embedding and Llama 3's "
                "scaling ('llama3') only",
                c.where(), key, type);
  m.ropeScaling.enabled = true;
  m.ropeScaling.factor = r.getDouble("factor");
  m.ropeScaling.lowFreqFactor = r.getDouble("low_freq_factor");
  m.ropeScaling.highFreqFactor = r.getDouble("high_freq_factor");
  m.ropeScaling.originalMaxPositions = r.getInt("original_max_position_embeddings");
  TESSERA_CHECK(m.ropeScaling.factor > 0 && m.ropeScaling.highFreqFactor > m.ropeScaling.lowFreqFactor &&
                    m.ropeScaling.originalMaxPositions > 0,
                "tessera hf: '{}': {}: factor {} must be > 0, high_freq_factor {} > low_freq_factor {}, "
                "original_max_position_embeddings {} > 0",
                c.where(), key, m.ropeScaling.factor, m.ropeScaling.highFreqFactor, m.ropeScaling.lowFreqFactor,
                m.ropeScaling.originalMaxPositions);
}

const std::vector<std::pair<std::string, std::string>>& layerNames() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"wq.weight", "self_attn.q_proj.weight"},
      {"wk.weight", "self_attn.k_proj.weight"},       {"wv.weight", "self_attn.v_proj.weight"},
      {"wo.weight", "self_attn.o_proj.weight"},       {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"q_norm.weight", "self_attn.q_norm.weight"},   {"k_norm.weight", "self_attn.k_norm.weight"},
      {"w1.weight", "mlp.gate_proj.weight"},          {"w3.weight", "mlp.up_proj.weight"},
      {"w2.weight", "mlp.down_proj.weight"}};
  return names;
}

const std::map<std::string, std::string>& topNames() {
  static const std::map<std::string, std::string> names = {{"emb.weight", "model.embed_tokens.weight"},
                                                            {"norm.weight", "model.norm.weight"},
                                                            {"head.weight", "lm_head.weight"}};
  return names;
}

}  // namespace

ModelConfig llamaConfigFromHf(const ConfigJson& c) {
  const Family family = familyOfConfig(c);
  TESSERA_CHECK(!c.getBool("attention_bias", false),
                "tessera hf: '{}': attention_bias is true: tessera's Llama has no attention biases", c.where());
  TESSERA_CHECK(!c.getBool("mlp_bias", false), "tessera hf: '{}': mlp_bias is true: tessera's Llama has no MLP biases",
                c.where());
  const std::string act = c.getString("hidden_act", "silu");
  TESSERA_CHECK(act == "silu", "tessera hf: '{}': hidden_act is '{}': tessera's Llama MLP is SwiGLU (silu)", c.where(),
                act);
  ModelConfig m = models::presetConfig("llama-tiny");
  m.d = c.getInt("hidden_size");
  m.ffn = c.getInt("intermediate_size");
  m.layers = c.getInt("num_hidden_layers");
  m.heads = c.getInt("num_attention_heads");
  m.kvHeads = c.getInt("num_key_value_heads", m.heads);
  m.vocab = c.getInt("vocab_size");
  m.seqLen = c.getInt("max_position_embeddings", 2048);
  m.normEps = c.getDouble("rms_norm_eps", 1e-6);
  m.ropeTheta = c.getDouble("rope_theta", 10000);
  m.ropeScaling = {};
  m.tiedEmbeddings = c.getBool("tie_word_embeddings", false);
  readRope(c, m);
  readFamilyFields(c, family, m);
  try {
    models::validate(m);
  } catch (const Error& e) {
    throw Error(fmt::format("tessera hf: '{}': {}", c.where(), e.what()));
  }
  return m;
}

ModelConfig readLlamaConfig(const std::string& hfDir) { return llamaConfigFromHf(ConfigJson::read(hfDir)); }

ConfigJson llamaConfigToHf(const ModelConfig& c, const std::string& dtype, const std::optional<ConfigJson>& base) {
  const Family family = familyOf(c);
  TESSERA_CHECK(dtype == "bfloat16" || dtype == "float32", "tessera hf: torch_dtype '{}' (bfloat16 or float32)", dtype);
  ConfigJson j = base ? *base : ConfigJson("config.json");
  auto& o = j.json();
  o.erase("rope_parameters");  // transformers 5 derives it from rope_theta / rope_scaling
  o["hidden_size"] = c.d;
  o["intermediate_size"] = c.ffnSize();
  o["num_hidden_layers"] = c.layers;
  o["num_attention_heads"] = c.heads;
  o["num_key_value_heads"] = c.kvH();
  o["head_dim"] = c.headDim();
  o["vocab_size"] = c.vocab;
  o["rms_norm_eps"] = c.normEps;
  o["rope_theta"] = c.ropeTheta;
  if (c.ropeScaling.enabled) {
    const auto& s = c.ropeScaling;
    o["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.lowFreqFactor},
                         {"high_freq_factor", s.highFreqFactor},
                         {"original_max_position_embeddings", s.originalMaxPositions}};
  } else {
    o["rope_scaling"] = nullptr;
  }
  o["tie_word_embeddings"] = c.tiedEmbeddings;
  if (!o.contains("max_position_embeddings")) o["max_position_embeddings"] = c.seqLen;
  o["hidden_act"] = "silu";
  o["attention_bias"] = false;
  o["mlp_bias"] = false;
  writeFamilyFields(c, family, o);
  o["torch_dtype"] = dtype;
  if (o.contains("dtype")) o["dtype"] = dtype;  // transformers 5's name for it
  if (!o.contains("initializer_range")) o["initializer_range"] = 0.02;
  if (!o.contains("use_cache")) o["use_cache"] = true;
  return j;
}

std::string hfName(const std::string& t) {
  if (auto it = topNames().find(t); it != topNames().end()) return it->second;
  static const std::regex block(R"(blocks\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(t, m, block)) {
    for (const auto& [ours, theirs] : layerNames()) {
      if (m[2] == ours) return fmt::format("model.layers.{}.{}", m[1].str(), theirs);
    }
  }
  throw Error(fmt::format("tessera hf: tensor '{}' has no Hugging Face Llama name", t));
}

std::string tesseraName(const std::string& h) {
  for (const auto& [ours, theirs] : topNames()) {
    if (h == theirs) return ours;
  }
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (std::regex_match(h, m, layer)) {
    for (const auto& [ours, theirs] : layerNames()) {
      if (m[2] == theirs) return fmt::format("blocks.{}.{}", m[1].str(), ours);
    }
  }
  const bool bias = h.size() > 5 && h.compare(h.size() - 5, 5, ".bias") == 0;
  throw Error(fmt::format("tessera hf: tensor '{}' has no place in tessera's Llama{}", h,
                          bias ? " (biases are not supported)" : ""));
}

std::vector<std::string> llamaTensorNames(const ModelConfig& c) {
  std::vector<std::string> out;
  for (const auto& t : tensorMap(c)) out.push_back(t.name);
  return out;
}

std::vector<int64_t> llamaTensorShape(const ModelConfig& c, const std::string& name) {
  for (const auto& t : tensorMap(c)) {
    if (t.name == name) return t.shape;
  }
  throw Error(fmt::format("tessera hf: tensor '{}' is not a tensor of {}", name, c.describe()));
}

void checkLlamaTensors(const SafetensorsCheckpoint& ck, const ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> want;  // HF name -> shape
  for (const auto& t : tensorMap(c)) {
    for (const auto& h : t.hf) {
      want[h] = t.hf.size() == 1 ? t.shape : std::vector<int64_t>(t.shape.begin() + 1, t.shape.end());
    }
  }
  std::vector<std::string> missing, unexpected;
  for (const auto& kv : want) {
    if (!ck.contains(kv.first)) missing.push_back(kv.first);
  }
  for (const auto& n : ck.names()) {
    const bool ignored = n.find("rotary_emb.inv_freq") != std::string::npos || (c.tiedEmbeddings && n == "lm_head.weight");
    if (want.count(n) || ignored) continue;
    const bool bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    unexpected.push_back(fmt::format("'{}'{} in {}", n, bias ? " (a bias: tessera's Llama has none)" : "",
                                     ck.fileOf(n).path()));
  }
  TESSERA_CHECK(missing.empty() && unexpected.empty(),
                "tessera hf: '{}' does not hold the model's tensors ({}): {} missing{}{}; {} unexpected{}{}", ck.path(),
                c.describe(), missing.size(), missing.empty() ? "" : ": ", fmt::join(missing, ", "), unexpected.size(),
                unexpected.empty() ? "" : ": ", fmt::join(unexpected, ", "));
  for (const auto& [name, shape] : want) {
    const auto& e = ck.entry(name);
    TESSERA_CHECK(e.shape == shape, "tessera hf: '{}': tensor '{}' has shape [{}], the config gives [{}]",
                  ck.fileOf(e.name).path(), e.name, fmt::join(e.shape, ", "), fmt::join(shape, ", "));
    const bool isFloat = e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16 || e.dtype == DType::F64;
    TESSERA_CHECK(isFloat, "tessera hf: '{}': tensor '{}' is {}, not a float dtype (F32, BF16, F16, F64)",
                  ck.fileOf(e.name).path(), e.name, dtypeName(e.dtype));
  }
}

namespace {
// `dst` (a box of HF tensor `h`, 1-D or 2-D, starting at `offset`) from the files.
void fillBox(const SafetensorsCheckpoint& ck, const std::string& h, const std::string& piece,
             const std::vector<int64_t>& offset, at::Tensor dst) {
  const auto& e = ck.entry(h);
  TESSERA_CHECK(dst.dim() == static_cast<int64_t>(e.shape.size()) && offset.size() == e.shape.size() &&
                    !e.shape.empty() && e.shape.size() <= 2,
                "tessera hf: '{}': tensor '{}' of shape [{}] does not fit '{}' (a box [{}] at [{}])",
                ck.fileOf(h).path(), h, fmt::join(e.shape, ", "), piece, fmt::join(dst.sizes(), ", "),
                fmt::join(offset, ", "));
  const Range rows{offset[0], offset[0] + dst.size(0)};
  const Range cols = e.shape.size() == 2 ? Range{offset[1], offset[1] + dst.size(1)} : Range{};
  dst.copy_(ck.slice(h, rows, cols));
}
}  // namespace

void fillLlamaPieces(const SafetensorsCheckpoint& ck, const ModelConfig& c, std::vector<checkpoint::Piece>& pieces) {
  at::NoGradGuard ng;
  std::map<std::string, TensorMap> byName;
  for (auto& t : tensorMap(c)) byName.emplace(t.name, std::move(t));
  for (auto& p : pieces) {
    const auto it = byName.find(p.name);
    TESSERA_CHECK(it != byName.end() && it->second.shape == p.globalShape,
                  "tessera hf: '{}' of shape [{}] is no tensor of the Hugging Face model ({})", p.name,
                  fmt::join(p.globalShape, ", "), c.describe());
    const auto& hf = it->second.hf;
    if (hf.empty()) {  // the router's selection bias starts at zero
      p.local.zero_();
    } else if (hf.size() == 1) {
      fillBox(ck, hf[0], p.name, p.offset, p.local);
    } else {  // experts [first, first + n) of [E, rows, cols], each its own HF tensor
      const std::vector<int64_t> inner(p.offset.begin() + 1, p.offset.end());
      for (int64_t k = 0; k < p.local.size(0); ++k) {
        fillBox(ck, hf[static_cast<size_t>(p.offset[0] + k)], p.name, inner, p.local[k]);
      }
    }
  }
}

}  // namespace tessera::hf
