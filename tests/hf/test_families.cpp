// src/hf's families (hf/families.h): Qwen3, Mixtral, Qwen3-MoE and OLMoE.
// - The presets olmoe-1b-7b, qwen3-30b-a3b and mixtral-8x7b are what their published config.json
//   files map to; tiny configs of each family map every field both ways, idempotently.
// - Refusals name the field: on import (latent attention, sliding windows, clip_qkv, jitter, an
//   unknown model_type) and on export (a sigmoid router, shared experts, the selection bias, a
//   capacity, dense layers in Mixtral or OLMoE, a whole q/k norm without experts).
// - Round trip: tiny directories written by tests/hf/hf_families.py (an independent writer) are
//   imported into tessera checkpoints and exported back with the same tensors and config fields
//   (hf_families.py compare), then export -> import -> export is byte-identical; expert boxes (as
//   expert parallelism holds them) are filled from each expert's tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <filesystem>

#include "harness/multiprocess.h"
#include "hf/convert.h"
#include "hf/families.h"
#include "hf/llama.h"
#include "hf_testing.h"
#include "tessera/checkpoint/stream_writer.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;

namespace {

models::ModelConfig parseJson(const nlohmann::json& j) { return llamaConfigFromHf(ConfigJson(j, "cfg.json")); }

// The published config.json files' fields (Hugging Face hub, 2024-2025).
nlohmann::json published(const std::string& preset) {
  nlohmann::json base = {{"hidden_act", "silu"},
                         {"attention_bias", false},
                         {"tie_word_embeddings", false},
                         {"rope_scaling", nullptr},
                         {"initializer_range", 0.02}};
  if (preset == "olmoe-1b-7b") {
    base.update({{"model_type", "olmoe"},
                 {"hidden_size", 2048},
                 {"intermediate_size", 1024},
                 {"num_hidden_layers", 16},
                 {"num_attention_heads", 16},
                 {"num_key_value_heads", 16},
                 {"num_experts", 64},
                 {"num_experts_per_tok", 8},
                 {"norm_topk_prob", false},
                 {"clip_qkv", nullptr},
                 {"max_position_embeddings", 4096},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 10000.0},
                 {"router_aux_loss_coef", 0.01},
                 {"output_router_logits", false},
                 {"vocab_size", 50304}});
  } else if (preset == "qwen3-30b-a3b") {
    base.update({{"model_type", "qwen3_moe"},
                 {"hidden_size", 2048},
                 {"intermediate_size", 6144},
                 {"moe_intermediate_size", 768},
                 {"num_hidden_layers", 48},
                 {"num_attention_heads", 32},
                 {"num_key_value_heads", 4},
                 {"head_dim", 128},
                 {"num_experts", 128},
                 {"num_experts_per_tok", 8},
                 {"norm_topk_prob", true},
                 {"decoder_sparse_step", 1},
                 {"mlp_only_layers", nlohmann::json::array()},
                 {"max_position_embeddings", 40960},
                 {"rms_norm_eps", 1e-6},
                 {"rope_theta", 1000000.0},
                 {"use_sliding_window", false},
                 {"sliding_window", nullptr},
                 {"max_window_layers", 48},
                 {"router_aux_loss_coef", 0.001},
                 {"output_router_logits", false},
                 {"vocab_size", 151936}});
  } else {
    base.update({{"model_type", "mixtral"},
                 {"hidden_size", 4096},
                 {"intermediate_size", 14336},
                 {"num_hidden_layers", 32},
                 {"num_attention_heads", 32},
                 {"num_key_value_heads", 8},
                 {"num_local_experts", 8},
                 {"num_experts_per_tok", 2},
                 {"max_position_embeddings", 32768},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 1e6},
                 {"sliding_window", nullptr},
                 {"router_aux_loss_coef", 0.02},
                 {"output_router_logits", false},
                 {"vocab_size", 32000}});
  }
  return base;
}

}  // namespace

TEST(HfFamilies, PresetsAreTheirPublishedConfigs) {
  for (const char* name : {"olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"}) {
    const auto want = models::presetConfig(name);
    const auto got = parseJson(published(name));
    EXPECT_EQ(got.signature(), want.signature()) << name;
    EXPECT_EQ(got.seqLen, want.seqLen) << name;
    EXPECT_EQ(got.normEps, want.normEps) << name;
    EXPECT_EQ(got.ropeTheta, want.ropeTheta) << name;
    EXPECT_EQ(got.moe.normTopK, want.moe.normTopK) << name;
    EXPECT_EQ(std::string(modelType(familyOf(want))), published(name)["model_type"].get<std::string>()) << name;
  }
  const auto q = models::presetConfig("qwen3-30b-a3b");
  EXPECT_EQ(q.headDim(), 128);
  EXPECT_NEAR(models::paramCount(q) / 1e9, 30.5, 0.1);  // Qwen3-30B-A3B: 30.5 B parameters
  EXPECT_NEAR(models::paramCount(models::presetConfig("mixtral-8x7b")) / 1e9, 46.7, 0.1);
  EXPECT_NEAR(models::paramCount(models::presetConfig("olmoe-1b-7b")) / 1e9, 6.9, 0.1);
  double active = 0;  // FLOPs: attention over 32 heads of 128 (4096 wide, not d = 2048)
  for (int64_t l = 0; l < q.layers; ++l) active += static_cast<double>(models::activeBlockParamCount(q, l));
  EXPECT_DOUBLE_EQ(models::flopsPerToken(q) - 6.0 * (active + 151936.0 * 2048), 12.0 * 48 * 4096 * 40960);
}

TEST(HfFamilies, EveryFieldBothWays) {
  auto qwen = published("qwen3-30b-a3b");
  qwen.update({{"num_hidden_layers", 4},
               {"mlp_only_layers", {0, 1, 3}},
               {"decoder_sparse_step", 1},
               {"output_router_logits", true},
               {"bos_token_id", 7}});
  auto c = parseJson(qwen);
  EXPECT_EQ(c.moe.firstDense, 2);  // layers 0 and 1: a first dense block
  EXPECT_EQ(c.moe.denseLayers, std::vector<int64_t>{3});
  EXPECT_DOUBLE_EQ(c.moe.auxLossCoef, 0.001);
  EXPECT_EQ(c.qkNorm, models::QkNorm::PerHead);
  auto dense = qwen;
  dense["model_type"] = "qwen3";
  dense.erase("head_dim");  // Qwen3's default: 128
  EXPECT_EQ(parseJson(dense).headDim(), 128);
  EXPECT_EQ(parseJson(dense).moe.experts, 0);
  for (const auto& j : {qwen, dense, published("olmoe-1b-7b"), published("mixtral-8x7b")}) {
    const auto m = parseJson(j);
    const auto out = llamaConfigToHf(m, "bfloat16", ConfigJson(j, "base"));
    EXPECT_EQ(out.json()["model_type"], j["model_type"]);
    EXPECT_EQ(out.json()["architectures"][0].get<std::string>(),
              std::string(architecture(familyOfConfig(ConfigJson(j, "base")))));
    EXPECT_EQ(llamaConfigFromHf(out).signature(), m.signature());
    EXPECT_EQ(llamaConfigToHf(llamaConfigFromHf(out), "bfloat16", out).json(), out.json());  // idempotent
    for (const char* k : {"mlp_only_layers", "num_experts", "num_local_experts", "moe_intermediate_size",
                          "norm_topk_prob", "intermediate_size", "head_dim", "bos_token_id"}) {
      if (j.contains(k)) EXPECT_EQ(out.json()[k], j[k]) << j["model_type"] << " " << k;
    }
  }
}

TEST(HfFamilies, RefusalsNameTheField) {
  const std::vector<std::tuple<std::string, std::string, nlohmann::json, std::string>> in = {
      {"qwen3-30b-a3b", "use_sliding_window", true, "sliding_window is unset with use_sliding_window"},
      {"mixtral-8x7b", "sliding_window", 4096, "sliding_window is 4096"},
      {"mixtral-8x7b", "router_jitter_noise", 0.1, "router_jitter_noise is 0.1"},
      {"olmoe-1b-7b", "clip_qkv", 8.0, "clip_qkv is 8.0"},
      {"olmoe-1b-7b", "head_dim", 64, "head_dim is 64: OLMoE's heads split hidden_size"},
      {"qwen3-30b-a3b", "kv_lora_rank", 512, "kv_lora_rank is set: multi-head latent attention"},
      {"qwen3-30b-a3b", "model_type", "deepseek_v3", "model_type is 'deepseek_v3'"},
      {"qwen3-30b-a3b", "mlp_only_layers", {60}, "dense layer 60 (mlp_only_layers)"},
      {"mixtral-8x7b", "num_local_experts", 0, "num_local_experts is 0"}};
  for (const auto& [preset, field, value, want] : in) {
    auto j = published(preset);
    j[field] = value;
    const auto e = errorOf([&] { parseJson(j); });
    EXPECT_NE(e.find(want), std::string::npos) << field << ": " << e;
  }
  const auto moe = models::presetConfig("moe-tiny");  // a shared expert, layer 0 dense
  auto olmoe = models::presetConfig("olmoe-1b-7b");
  const std::vector<std::pair<std::function<void(models::ModelConfig&)>, std::string>> out = {
      {[](auto& c) { c.moe.score = models::RouterScore::Sigmoid; }, "moe.score is sigmoid"},
      {[](auto& c) { c.moe.sharedFfn = 64; }, "moe.sharedFfn is 64"},
      {[](auto& c) { c.moe.biasUpdateRate = 0.001; }, "moe.biasUpdateRate is 0.001 (the router's selection bias)"},
      {[](auto& c) { c.moe.capacityFactor = 1.5; }, "moe.capacityFactor is 1.5"},
      {[](auto& c) { c.moe.routedScale = 2.5; }, "moe.routedScale is 2.5"},
      {[](auto& c) { c.moe.denseLayers = {3}; }, "every layer is sparse in olmoe"},
      {[](auto& c) { c.moe.experts = 0; }, "qkNorm 'whole' without experts"},
      {[](auto& c) { c.qkNorm = models::QkNorm::None, c.moe.normTopK = false; }, "Mixtral always renormalises"}};
  for (const auto& [change, want] : out) {
    auto c = olmoe;
    change(c);
    const auto e = errorOf([&] { llamaConfigToHf(c, "float32"); });
    EXPECT_NE(e.find(want), std::string::npos) << want << ": " << e;
  }
  EXPECT_NE(errorOf([&] { tensorMap(moe); }).find("moe.sharedFfn is 64"), std::string::npos);
}

TEST(HfFamilies, ExpertNames) {
  auto mix = models::presetConfig("mixtral-8x7b");
  mix.layers = 1;
  const auto m = tensorMap(mix);
  ASSERT_EQ(m.size(), 1u + 5 + 1 + 5 + 2);  // emb, attention, mlp_norm, router + bias + 3 experts, norm, head
  EXPECT_EQ(m[7].hf[0], "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_TRUE(m[8].hf.empty());  // the selection bias: no HF tensor
  EXPECT_EQ(m[9].name, "blocks.0.moe.w1.weight");
  EXPECT_EQ(m[9].hf[7], "model.layers.0.block_sparse_moe.experts.7.w1.weight");
  EXPECT_EQ(m[11].hf[0], "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(m[11].shape, (std::vector<int64_t>{8, 4096, 14336}));
  auto q = models::presetConfig("qwen3-30b-a3b");
  q.layers = 1;
  const auto n = tensorMap(q);
  EXPECT_EQ(n[6].hf[0], "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(n[6].shape, std::vector<int64_t>{128});
  EXPECT_EQ(n[2].shape, (std::vector<int64_t>{32 * 128, 2048}));
  EXPECT_EQ(n[11].hf[127], "model.layers.0.mlp.experts.127.gate_proj.weight");
}

using HfFamiliesDir = HfDir;

TEST_F(HfFamiliesDir, ImportExportRoundTrips) {
  const auto script = fmt::format("/usr/bin/python3 {}/tests/hf/hf_families.py", TESSERA_SOURCE_DIR);
  ASSERT_EQ(std::system(fmt::format("{} write {}", script, path("in")).c_str()), 0);
  ConvertOptions o;
  o.dtype = "fp32";
  o.maxShardBytes = 60'000;  // several files and an index
  o.progressEvery = 0;
  std::string pairs;
  for (const char* family : {"qwen3", "mixtral", "qwen3_moe", "olmoe"}) {
    const std::string in = path("in") + "/" + family, out = path("out") + "/" + family;
    importLlama(in, path("ck1") + "/" + family, o);
    exportLlama(path("ck1") + "/" + family, out, o);
    pairs += " " + in + " " + out;
    importLlama(out, path("ck2") + "/" + family, o);
    exportLlama(path("ck2") + "/" + family, path("again") + "/" + family, o);
    size_t files = 0;
    for (const auto& f : std::filesystem::directory_iterator(out)) {
      EXPECT_EQ(readBytes(f.path()), readBytes(path("again") + "/" + family + "/" + f.path().filename().string()))
          << family << ": " << f.path().filename();
      ++files;
    }
    EXPECT_GE(files, 4u) << family;  // config, generation config, index, shards
  }
  EXPECT_EQ(std::system(fmt::format("{} compare{}", script, pairs).c_str()), 0) << pairs;
  // Expert boxes (experts 2..3 of 6, half of their rows) from each expert's tensor.
  const auto c = readLlamaConfig(path("in") + "/qwen3_moe");
  const SafetensorsCheckpoint ck(path("in") + "/qwen3_moe");
  const auto full = checkpoint::Reader(path("ck1") + "/qwen3_moe").read("blocks.2.moe.w2.weight");
  std::vector<checkpoint::Piece> p{{"blocks.2.moe.w2.weight", {6, 32, 16}, {2, 16, 0}, at::empty({2, 16, 16})},
                                   {"blocks.2.moe.router.bias", {6}, {0}, at::ones({6}), true}};
  fillLlamaPieces(ck, c, p);
  EXPECT_TRUE(at::equal(p[0].local, full.narrow(0, 2, 2).narrow(1, 16, 16)));
  EXPECT_TRUE(at::equal(p[1].local, at::zeros({6})));
}
