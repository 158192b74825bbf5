// src/hf's Llama mapping (hf/llama.h), the streaming writers (hf::CheckpointWriter,
// checkpoint::StreamWriter) and checkpoint::Reader, locally: every config field both ways and
// every refusal naming its field; tensor names both ways; the tensor checks; filling tp shards
// (row and column boxes) from bf16 files; streamed files byte-identical to writeCheckpoint's.
// The command-level round trip against an independent reference is tests/hf/roundtrip_test.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tessera/checkpoint/stream_writer.h"
#include "hf/llama.h"
#include "hf_testing.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;

namespace {

nlohmann::json tinyConfig() {
  return {{"model_type", "llama"},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 128},
          {"max_position_embeddings", 48},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 16}}},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1}};
}

models::ModelConfig parse(const nlohmann::json& j) { return llamaConfigFromHf(ConfigJson(j, "cfg.json")); }

using HfLlama = HfDir;

TEST(HfLlamaConfig, EveryFieldMaps) {
  const auto c = parse(tinyConfig());
  EXPECT_EQ(c.arch, models::Arch::Llama);
  EXPECT_EQ(c.d, 64);
  EXPECT_EQ(c.ffn, 96);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kvH(), 2);
  EXPECT_EQ(c.vocab, 128);
  EXPECT_EQ(c.seqLen, 48);
  EXPECT_DOUBLE_EQ(c.normEps, 1e-5);
  EXPECT_DOUBLE_EQ(c.ropeTheta, 500000.0);
  EXPECT_TRUE(c.ropeScaling.enabled);
  EXPECT_DOUBLE_EQ(c.ropeScaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.ropeScaling.lowFreqFactor, 1.0);
  EXPECT_DOUBLE_EQ(c.ropeScaling.highFreqFactor, 4.0);
  EXPECT_EQ(c.ropeScaling.originalMaxPositions, 16);
  EXPECT_FALSE(c.tiedEmbeddings);
  // transformers' defaults for absent fields; transformers 5's rope_parameters.
  auto j = tinyConfig();
  for (const char* k : {"num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings"}) {
    j.erase(k);
  }
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  const auto d = parse(j);
  EXPECT_EQ(d.kvH(), 4);
  EXPECT_DOUBLE_EQ(d.normEps, 1e-6);
  EXPECT_DOUBLE_EQ(d.ropeTheta, 1234.0);
  EXPECT_FALSE(d.ropeScaling.enabled);
  EXPECT_FALSE(d.tiedEmbeddings);
  j["rope_parameters"] = tinyConfig()["rope_scaling"];
  j["rope_parameters"]["rope_theta"] = 10.0;
  EXPECT_TRUE(parse(j).ropeScaling.enabled);
  EXPECT_DOUBLE_EQ(parse(j).ropeTheta, 10.0);
  // An explicit head_dim: heads of 32 over d 64 (q and o are [128, 64], [64, 128]).
  j["head_dim"] = 32;
  EXPECT_EQ(parse(j).headDim(), 32);
  EXPECT_EQ(llamaTensorShape(parse(j), "blocks.0.wo.weight"), (std::vector<int64_t>{64, 128}));
  j["head_dim"] = 16;
  EXPECT_EQ(parse(j).headSize, 0);  // = d / heads: no explicit size
}

TEST(HfLlamaConfig, RefusalsNameTheField) {
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"attention_bias", true, "attention_bias"},
      {"mlp_bias", true, "mlp_bias"},
      {"hidden_act", "gelu", "hidden_act is 'gelu'"},
      {"model_type", "mistral", "model_type is 'mistral'"},
      {"head_dim", 0, "head_dim is 0"},
      {"sliding_window", 4096, "sliding_window is 4096"},
      {"kv_lora_rank", 512, "kv_lora_rank is set: multi-head latent attention"},
      {"q_lora_rank", 1536, "q_lora_rank is set"},
      {"layer_types", {"full_attention", "sliding_attention"}, "layer_types holds \"sliding_attention\""},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "rope_type is 'yarn'"},
      {"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}, "rope_type is 'dynamic'"},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "low_freq_factor"},
      {"num_key_value_heads", 3, "kv heads = 3"},
      {"hidden_size", "64", "hidden_size"},
      {"vocab_size", nullptr, "vocab_size"}};
  for (const auto& [field, value, want] : cases) {
    auto j = tinyConfig();
    j[field] = value;
    const auto e = errorOf([&] { parse(j); });
    EXPECT_NE(e.find(want), std::string::npos) << field << ": " << e;
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  }
  auto j = tinyConfig();
  j.erase("hidden_size");
  EXPECT_NE(errorOf([&] { parse(j); }).find("'hidden_size' is missing"), std::string::npos);
}

TEST(HfLlamaConfig, BackToConfigJsonKeepsOtherFields) {
  const auto c = parse(tinyConfig());
  const auto out = llamaConfigToHf(c, "bfloat16", ConfigJson(tinyConfig(), "base"));
  EXPECT_EQ(out.json()["bos_token_id"], 1);
  EXPECT_EQ(out.json()["torch_dtype"], "bfloat16");
  EXPECT_EQ(out.json()["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(out.json()["head_dim"], 16);
  EXPECT_EQ(out.json()["rope_scaling"]["rope_type"], "llama3");
  const auto back = llamaConfigFromHf(out);
  EXPECT_EQ(back.signature(), c.signature());
  EXPECT_EQ(back.normEps, c.normEps);
  EXPECT_EQ(back.seqLen, c.seqLen);
  EXPECT_EQ(llamaConfigToHf(back, "bfloat16", out).json(), out.json());  // idempotent
  auto tied = c;
  tied.tiedEmbeddings = true;
  tied.ropeScaling = {};
  const auto t = llamaConfigToHf(tied, "float32");
  EXPECT_TRUE(t.json()["rope_scaling"].is_null());
  EXPECT_EQ(t.json()["max_position_embeddings"], 48);
  EXPECT_TRUE(llamaConfigFromHf(t).tiedEmbeddings);
  EXPECT_NE(errorOf([&] { llamaConfigToHf(models::presetConfig("tiny"), "float32"); }).find("only the Llama"),
            std::string::npos);
}

TEST(HfLlamaNames, BothWays) {
  const auto c = parse(tinyConfig());
  const auto names = llamaTensorNames(c);
  EXPECT_EQ(names.size(), 1u + 9 * 2 + 2);
  for (const auto& n : names) EXPECT_EQ(tesseraName(hfName(n)), n);
  EXPECT_EQ(hfName("blocks.1.w1.weight"), "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(hfName("blocks.0.w3.weight"), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(hfName("blocks.0.w2.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(hfName("blocks.0.attn_norm.weight"), "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(hfName("head.weight"), "lm_head.weight");
  EXPECT_EQ(llamaTensorShape(c, "blocks.0.wk.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(llamaTensorShape(c, "blocks.0.w2.weight"), (std::vector<int64_t>{64, 96}));
  EXPECT_NE(errorOf([] { tesseraName("model.layers.0.self_attn.q_proj.bias"); }).find("biases are not supported"),
            std::string::npos);
  EXPECT_NE(errorOf([] { hfName("blocks.0.wqkv.weight"); }).find("wqkv"), std::string::npos);
}

// The model's tensors as an HF checkpoint written by tessera's writer (values: a pattern).
NamedTensors hfTensors(const models::ModelConfig& c, at::ScalarType type) {
  NamedTensors out;
  for (const auto& n : llamaTensorNames(c)) out.emplace_back(hfName(n), pattern(n, type, llamaTensorShape(c, n)));
  return out;
}

TEST_F(HfLlama, TensorChecksNameTheTensor) {
  const auto c = parse(tinyConfig());
  auto tensors = hfTensors(c, at::kBFloat16);
  writeCheckpoint(path("ok"), tensors);
  checkLlamaTensors(SafetensorsCheckpoint(path("ok")), c);
  auto withBias = tensors;
  withBias.emplace_back("model.layers.0.self_attn.q_proj.bias", at::zeros({64}));
  withBias.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::zeros({8}));  // ignored
  writeCheckpoint(path("bias"), withBias);
  auto e = errorOf([&] { checkLlamaTensors(SafetensorsCheckpoint(path("bias")), c); });
  EXPECT_NE(e.find("q_proj.bias' (a bias"), std::string::npos) << e;
  EXPECT_EQ(e.find("inv_freq"), std::string::npos) << e;
  auto missing = tensors;
  missing.pop_back();
  writeCheckpoint(path("missing"), missing);
  e = errorOf([&] { checkLlamaTensors(SafetensorsCheckpoint(path("missing")), c); });
  EXPECT_NE(e.find("1 missing: lm_head.weight"), std::string::npos) << e;
  auto shape = tensors;
  shape[2].second = at::zeros({63, 64});
  writeCheckpoint(path("shape"), shape);
  e = errorOf([&] { checkLlamaTensors(SafetensorsCheckpoint(path("shape")), c); });
  EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.weight' has shape [63, 64], the config gives [64, 64]"),
            std::string::npos) << e;
  auto ints = tensors;
  ints[0].second = at::zeros({128, 64}, at::kInt);
  writeCheckpoint(path("int"), ints);
  e = errorOf([&] { checkLlamaTensors(SafetensorsCheckpoint(path("int")), c); });
  EXPECT_NE(e.find("'model.embed_tokens.weight' is I32, not a float dtype"), std::string::npos) << e;
  // A tied model: transformers drops lm_head.weight, other writers keep it: both load.
  auto tiedCfg = c;
  tiedCfg.tiedEmbeddings = true;
  checkLlamaTensors(SafetensorsCheckpoint(path("ok")), tiedCfg);
}

TEST_F(HfLlama, FillsTpShardsFromBf16Slices) {
  const auto c = parse(tinyConfig());
  writeCheckpoint(path("m"), hfTensors(c, at::kBFloat16));
  SafetensorsCheckpoint ck(path("m"));
  const auto wq = pattern("blocks.1.wq.weight", at::kBFloat16, {64, 64}).to(at::kFloat);
  const auto wo = pattern("blocks.0.wo.weight", at::kBFloat16, {64, 64}).to(at::kFloat);
  const auto norm = pattern("norm.weight", at::kBFloat16, {64}).to(at::kFloat);
  // tp rank 1 of 2: a column-parallel row box, a row-parallel column box, a replicated vector.
  std::vector<checkpoint::Piece> pieces{{"blocks.1.wq.weight", {64, 64}, {32, 0}, at::empty({32, 64})},
                                        {"blocks.0.wo.weight", {64, 64}, {0, 32}, at::empty({64, 32})},
                                        {"norm.weight", {64}, {0}, at::empty({64})}};
  fillLlamaPieces(ck, c, pieces);
  EXPECT_TRUE(at::equal(pieces[0].local, wq.narrow(0, 32, 32)));
  EXPECT_TRUE(at::equal(pieces[1].local, wo.narrow(1, 32, 32)));
  EXPECT_TRUE(at::equal(pieces[2].local, norm));
  std::vector<checkpoint::Piece> bad{{"blocks.1.wq.weight", {64, 32}, {0, 0}, at::empty({64, 32})}};
  auto e = errorOf([&] { fillLlamaPieces(ck, c, bad); });
  EXPECT_NE(e.find("'blocks.1.wq.weight' of shape [64, 32] is no tensor"), std::string::npos) << e;
  bad = {{"blocks.1.wq.weight", {64, 64}, {0, 0, 0}, at::empty({64, 32, 1})}};
  e = errorOf([&] { fillLlamaPieces(ck, c, bad); });
  EXPECT_NE(e.find("does not fit 'blocks.1.wq.weight'"), std::string::npos) << e;
}

TEST_F(HfLlama, StreamedFilesAreWriteCheckpointsBytes) {
  NamedTensors tensors;
  for (int i = 0; i < 7; ++i) {
    const auto name = "t" + std::to_string(i);
    tensors.emplace_back(name, pattern(name, i % 2 ? at::kFloat : at::kBFloat16, {3 + i, 5}));
  }
  WriteOptions o;
  o.maxShardBytes = 200;
  const auto files = writeCheckpoint(path("whole"), tensors, {}, o);
  ASSERT_GT(files.size(), 2u);
  // The same tensors streamed in writeCheckpoint's order (per file: larger elements first).
  SafetensorsCheckpoint ck(path("whole"));
  std::vector<TensorSpec> specs;
  std::vector<std::string> order;
  for (const auto& f : ck.files()) {
    for (const auto& n : f.names()) {
      specs.push_back({n, f.entry(n).dtype, f.entry(n).shape});
      order.push_back(n);
    }
  }
  CheckpointWriter w(path("streamed"), specs, {}, o);
  for (const auto& n : order) w.write(n, ck.get(n));
  EXPECT_EQ(w.finish(), files);
  for (const auto& f : files) {
    EXPECT_EQ(readBytes(path("streamed/" + f)), readBytes(path("whole/" + f))) << f;
  }
  CheckpointWriter w2(path("bad"), specs, {}, o);
  EXPECT_NE(errorOf([&] { w2.write(order[1], ck.get(order[1])); }).find("is planned"), std::string::npos);
  EXPECT_NE(errorOf([&] { w2.write(order[0], at::zeros({1, 5})); }).find("planned as"), std::string::npos);
  EXPECT_NE(errorOf([&] { w2.finish(); }).find("finish() after 0 of the 7"), std::string::npos);
  const auto grows = errorOf([&] {
    CheckpointWriter(path("grows"), {{"a", DType::BF16, {2}}, {"b", DType::F32, {2}}}, {}, {});
  });
  EXPECT_NE(grows.find("larger elements must come first"), std::string::npos) << grows;
}

TEST_F(HfLlama, CheckpointStreamWriterAndReader) {
  checkpoint::StreamWriterOptions o;
  o.maxFileBytes = 500;  // several files (the tensors are 320 to 448 bytes)
  checkpoint::StreamWriter w(path("ck"), o);
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (int i = 0; i < 5; ++i) {
    saved.emplace_back("w" + std::to_string(i), at::randn({10 + i, 8}));
    w.add(saved.back().first, saved.back().second);
  }
  EXPECT_NE(errorOf([&] { w.add("w0", at::zeros({1})); }).find("given twice"), std::string::npos);
  w.finish(0, {{"weights_only", "true"}});
  EXPECT_GE(w.files(), 3);
  checkpoint::Reader r(path("ck"));
  EXPECT_EQ(r.metadata().step, 0);
  EXPECT_EQ(r.metadata().world, 1);
  EXPECT_EQ(r.metadata().extra.at("weights_only"), "true");
  for (const auto& [n, t] : saved) EXPECT_TRUE(at::equal(r.read(n), t)) << n;
  std::vector<checkpoint::Piece> box{{"w3", {13, 8}, {4, 2}, at::empty({5, 3})}};
  r.load(box);
  EXPECT_TRUE(at::equal(box[0].local, saved[3].second.narrow(0, 4, 5).narrow(1, 2, 3)));
  EXPECT_NE(errorOf([&] { r.read("nope"); }).find("holds no tensor 'nope'"), std::string::npos);
}

}  // namespace
