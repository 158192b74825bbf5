// The Hugging Face families of the Llama block; see families.h.
#include "hf/families.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <tuple>

#include "tessera/common/error.h"

namespace tessera::hf {

using models::ModelConfig;
using models::QkNorm;

namespace {

struct Names {
  Family family;
  const char* type;
  const char* arch;
};
constexpr Names kFamilies[] = {{Family::Llama, "llama", "LlamaForCausalLM"},
                               {Family::Qwen3, "qwen3", "Qwen3ForCausalLM"},
                               {Family::Mixtral, "mixtral", "MixtralForCausalLM"},
                               {Family::Qwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM"},
                               {Family::Olmoe, "olmoe", "OlmoeForCausalLM"}};

bool sparse(Family f) { return f == Family::Mixtral || f == Family::Qwen3Moe || f == Family::Olmoe; }

// Fields of other families' attention that tessera does not implement: refused when set.
void refuseUnsupported(const ConfigJson& c, Family f) {
  for (const char* k : {"kv_lora_rank", "q_lora_rank"}) {
    TESSERA_CHECK(!c.has(k), "tessera hf: '{}': {} is set: multi-head latent attention (DeepSeek) is not supported",
                  c.where(), k);
  }
  TESSERA_CHECK(!c.has("clip_qkv"), "tessera hf: '{}': clip_qkv is {}: tessera does not clip q, k, v", c.where(),
                c.json()["clip_qkv"].dump());
  TESSERA_CHECK(c.getDouble("router_jitter_noise", 0) == 0,
                "tessera hf: '{}': router_jitter_noise is {}: tessera's router adds no noise", c.where(),
                c.getDouble("router_jitter_noise", 0));
  const bool windowed =
      f == Family::Mixtral || f == Family::Llama ? c.has("sliding_window") : c.getBool("use_sliding_window", false);
  TESSERA_CHECK(!windowed, "tessera hf: '{}': sliding_window is {}{}: tessera's attention is full causal attention",
                c.where(), c.has("sliding_window") ? c.json()["sliding_window"].dump() : "unset",
                f == Family::Mixtral || f == Family::Llama ? "" : " with use_sliding_window");
  if (c.has("layer_types")) {
    for (const auto& t : c.json()["layer_types"]) {
      TESSERA_CHECK(t == "full_attention", "tessera hf: '{}': layer_types holds {}: full_attention only", c.where(),
                    t.dump());
    }
  }
}

// Qwen3-MoE's sparse layers: a first block of dense layers becomes firstDense, the rest denseLayers.
void readDenseLayers(const ConfigJson& c, models::MoeConfig& m) {
  if (!c.has("mlp_only_layers")) return;
  auto layers = c.getIntList("mlp_only_layers");
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  size_t prefix = 0;
  while (prefix < layers.size() && layers[prefix] == static_cast<int64_t>(prefix)) ++prefix;
  m.firstDense = static_cast<int64_t>(prefix);
  m.denseLayers.assign(layers.begin() + static_cast<std::ptrdiff_t>(prefix), layers.end());
}

void readExperts(const ConfigJson& c, Family f, ModelConfig& m) {
  auto& e = m.moe;
  e.experts = c.getInt(f == Family::Mixtral ? "num_local_experts" : "num_experts");
  TESSERA_CHECK(e.experts > 0, "tessera hf: '{}': {} is {}: a sparse family needs experts", c.where(),
                f == Family::Mixtral ? "num_local_experts" : "num_experts", e.experts);
  e.topK = c.getInt("num_experts_per_tok");
  e.normTopK = f == Family::Mixtral || c.getBool("norm_topk_prob", false);
  e.auxLossCoef = c.getBool("output_router_logits", false) ? c.getDouble("router_aux_loss_coef", 0.001) : 0;
  if (f == Family::Qwen3Moe) {
    e.expertFfn = c.getInt("moe_intermediate_size");
    e.sparseStep = c.getInt("decoder_sparse_step", 1);
    readDenseLayers(c, e);
  }
}

}  // namespace

const char* modelType(Family f) { return kFamilies[static_cast<int>(f)].type; }
const char* architecture(Family f) { return kFamilies[static_cast<int>(f)].arch; }

Family familyOfConfig(const ConfigJson& c) {
  const std::string type = c.getString("model_type", "llama");
  for (const auto& n : kFamilies) {
    if (type == n.type) return n.family;
  }
  throw Error(
      fmt::format("tessera hf: '{}': model_type is '{}': tessera maps llama, qwen3, mixtral, qwen3_moe and "
                  "olmoe models",
                  c.where(), type));
}

void readFamilyFields(const ConfigJson& c, Family f, ModelConfig& m) {
  refuseUnsupported(c, f);
  // Qwen3's config defaults head_dim to 128; the others to hidden_size / heads.
  const int64_t split = m.heads > 0 ? m.d / m.heads : 0;
  const int64_t hd = c.getInt("head_dim", f == Family::Qwen3 ? 128 : split);
  TESSERA_CHECK(hd > 0 && (f != Family::Olmoe || hd == split), "tessera hf: '{}': head_dim is {}: {}", c.where(), hd,
                hd > 0 ? "OLMoE's heads split hidden_size" : "it must be > 0");
  if (hd != split || m.heads * hd != m.d) m.headSize = hd;
  m.qkNorm = f == Family::Qwen3 || f == Family::Qwen3Moe ? QkNorm::PerHead
             : f == Family::Olmoe                        ? QkNorm::Whole
                                                         : QkNorm::None;
  if (sparse(f)) readExperts(c, f, m);
}

Family familyOf(const ModelConfig& c) {
  TESSERA_CHECK(c.arch == models::Arch::Llama, "tessera hf: only the Llama block maps to a Hugging Face model, not {}",
                c.describe());
  const auto& e = c.moe;
  if (e.experts == 0) {
    TESSERA_CHECK(c.qkNorm != QkNorm::Whole,
                  "tessera hf: qkNorm 'whole' without experts: no Hugging Face family has it (OLMoE's is sparse)");
    return c.qkNorm == QkNorm::PerHead ? Family::Qwen3 : Family::Llama;
  }
  auto refuse = [](bool bad, const std::string& what) {
    TESSERA_CHECK(!bad, "tessera hf: {}: Mixtral, Qwen3-MoE and OLMoE have no such field", what);
  };
  refuse(e.score != models::RouterScore::Softmax, "moe.score is sigmoid (DeepSeek-V3's router)");
  refuse(e.routedScale != 1.0, fmt::format("moe.routedScale is {}", e.routedScale));
  refuse(e.sharedFfn > 0, fmt::format("moe.sharedFfn is {} (shared experts)", e.sharedFfn));
  refuse(e.biasUpdateRate > 0, fmt::format("moe.biasUpdateRate is {} (the router's selection bias)", e.biasUpdateRate));
  refuse(e.capacityFactor > 0, fmt::format("moe.capacityFactor is {} (their blocks are dropless)", e.capacityFactor));
  const Family f = c.qkNorm == QkNorm::PerHead ? Family::Qwen3Moe
                   : c.qkNorm == QkNorm::Whole ? Family::Olmoe
                                               : Family::Mixtral;
  if (f == Family::Qwen3Moe) return f;
  bool allSparse = true;
  for (int64_t l = 0; l < c.layers; ++l) allSparse = allSparse && e.sparse(l);
  TESSERA_CHECK(allSparse,
                "tessera hf: {}: every layer is sparse in {} (moe.firstDense {}, moe.sparseStep {}, "
                "moe.denseLayers [{}])",
                c.describe(), modelType(f), e.firstDense, e.sparseStep, fmt::join(e.denseLayers, ", "));
  TESSERA_CHECK(f != Family::Mixtral || e.normTopK,
                "tessera hf: moe.normTopK is false: Mixtral always renormalises its top-k weights");
  TESSERA_CHECK(f != Family::Olmoe || c.headSize == 0 || c.headSize * c.heads == c.d,
                "tessera hf: headSize {} is not d / heads: OLMoE's heads split hidden_size", c.headSize);
  return f;
}

void writeFamilyFields(const ModelConfig& c, Family f, nlohmann::json& o) {
  o["architectures"] = {architecture(f)};
  o["model_type"] = modelType(f);
  if (f != Family::Llama && f != Family::Mixtral) o.erase("mlp_bias");
  if (f == Family::Qwen3 || f == Family::Qwen3Moe) o["use_sliding_window"] = false;
  if (f == Family::Olmoe) o["clip_qkv"] = nullptr;
  if (!sparse(f)) return;
  const auto& e = c.moe;
  o[f == Family::Mixtral ? "num_local_experts" : "num_experts"] = e.experts;
  o["num_experts_per_tok"] = e.topK;
  o["output_router_logits"] = e.auxLossCoef > 0;
  if (e.auxLossCoef > 0) o["router_aux_loss_coef"] = e.auxLossCoef;
  if (f != Family::Mixtral) o["norm_topk_prob"] = e.normTopK;
  if (f != Family::Qwen3Moe) {
    o["intermediate_size"] = c.expertFfn();  // every layer is sparse: their one FFN width
    return;
  }
  o["moe_intermediate_size"] = c.expertFfn();
  o["decoder_sparse_step"] = e.sparseStep;
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < c.layers; ++l) {
    if (l < e.firstDense || std::count(e.denseLayers.begin(), e.denseLayers.end(), l)) dense.push_back(l);
  }
  o["mlp_only_layers"] = dense;
}

namespace {
// Layer i's tensors in order: attention (and q/k norms), its MLP or its experts.
void layerMap(const ModelConfig& c, Family f, int64_t i, std::vector<TensorMap>& out) {
  const int64_t d = c.d, hd = c.headDim(), q = c.heads * hd, kv = c.kvH() * hd;
  const std::string t = fmt::format("blocks.{}.", i), h = fmt::format("model.layers.{}.", i);
  auto add = [&](const char* ours, std::vector<int64_t> shape, const char* theirs) {
    out.push_back({t + ours, std::move(shape), {h + theirs}});
  };
  add("attn_norm.weight", {d}, "input_layernorm.weight");
  add("wq.weight", {q, d}, "self_attn.q_proj.weight");
  add("wk.weight", {kv, d}, "self_attn.k_proj.weight");
  add("wv.weight", {kv, d}, "self_attn.v_proj.weight");
  add("wo.weight", {d, q}, "self_attn.o_proj.weight");
  if (c.qkNorm != QkNorm::None) {
    const bool whole = c.qkNorm == QkNorm::Whole;
    add("q_norm.weight", {whole ? q : hd}, "self_attn.q_norm.weight");
    add("k_norm.weight", {whole ? kv : hd}, "self_attn.k_norm.weight");
  }
  add("mlp_norm.weight", {d}, "post_attention_layernorm.weight");
  if (!c.moe.sparse(i)) {
    add("w1.weight", {c.ffnSize(), d}, "mlp.gate_proj.weight");
    add("w3.weight", {c.ffnSize(), d}, "mlp.up_proj.weight");
    add("w2.weight", {d, c.ffnSize()}, "mlp.down_proj.weight");
    return;
  }
  const bool mixtral = f == Family::Mixtral;
  const int64_t e = c.moe.experts, fe = c.expertFfn();
  const std::string moe = h + (mixtral ? "block_sparse_moe." : "mlp.");
  out.push_back({t + "moe.router.weight", {e, d}, {moe + "gate.weight"}});
  out.push_back({t + "moe.router.bias", {e}, {}});  // the selection bias: no HF tensor, zero
  const std::tuple<const char*, const char*, int64_t, int64_t> experts[] = {
      {"w1", mixtral ? "w1" : "gate_proj", fe, d},
      {"w3", mixtral ? "w3" : "up_proj", fe, d},
      {"w2", mixtral ? "w2" : "down_proj", d, fe}};
  for (const auto& [ours, theirs, rows, cols] : experts) {
    TensorMap m{fmt::format("{}moe.{}.weight", t, ours), {e, rows, cols}, {}};
    for (int64_t x = 0; x < e; ++x) m.hf.push_back(fmt::format("{}experts.{}.{}.weight", moe, x, theirs));
    out.push_back(std::move(m));
  }
}
}  // namespace

std::vector<TensorMap> tensorMap(const ModelConfig& c) {
  const Family f = familyOf(c);
  std::vector<TensorMap> out{{"emb.weight", {c.vocab, c.d}, {"model.embed_tokens.weight"}}};
  for (int64_t i = 0; i < c.layers; ++i) layerMap(c, f, i, out);
  out.push_back({"norm.weight", {c.d}, {"model.norm.weight"}});
  if (!c.tiedEmbeddings) out.push_back({"head.weight", {c.vocab, c.d}, {"lm_head.weight"}});
  return out;
}

}  // namespace tessera::hf
