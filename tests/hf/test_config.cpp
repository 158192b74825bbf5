// src/hf: config.json read and written; typed getters whose errors name the file and the field.
#include <gtest/gtest.h>

#include <filesystem>

#include "hf/config.h"
#include "hf_testing.h"

using namespace tessera;
using namespace tessera::hf;
using namespace tessera::testing;

namespace {

using Config = HfDir;

const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 4096,
  "num_attention_heads": 32,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "pad_token_id": null,
  "eos_token_id": [128001, 128008],
  "max_position_embeddings": 4096.0
})";

TEST_F(Config, TypedGetters) {
  writeFile(path("config.json"), kLlama);
  const ConfigJson c = ConfigJson::read(dir_.string());  // a directory: its config.json
  EXPECT_EQ(c.where(), path("config.json"));
  EXPECT_EQ(c.getInt("hidden_size"), 4096);
  EXPECT_EQ(c.getInt("num_key_value_heads", 8), 8);
  EXPECT_EQ(c.getDouble("rms_norm_eps"), 1e-5);
  EXPECT_EQ(c.getDouble("hidden_size"), 4096.0);  // an integer is a number
  EXPECT_EQ(c.getBool("tie_word_embeddings"), false);
  EXPECT_EQ(c.getString("torch_dtype"), "bfloat16");
  EXPECT_EQ(c.getIntList("eos_token_id"), (std::vector<int64_t>{128001, 128008}));
  EXPECT_FALSE(c.has("pad_token_id"));  // null
  EXPECT_EQ(c.getInt("pad_token_id", -1), -1);
  EXPECT_EQ(c.getObject("rope_scaling").getString("rope_type"), "llama3");
  EXPECT_EQ(c.json()["architectures"][0], "LlamaForCausalLM");

  const std::string f = path("config.json");
  expectError([&] { c.getInt("intermediate_size"); }, {f, "field 'intermediate_size' is missing (expected an integer)"});
  expectError([&] { c.getInt("pad_token_id"); }, {f, "field 'pad_token_id' is null"});
  expectError([&] { c.getInt("rms_norm_eps"); }, {f, "field 'rms_norm_eps' is 1e-05 (number), not an integer"});
  expectError([&] { c.getInt("max_position_embeddings"); }, {f, "'max_position_embeddings' is 4096.0", "not an integer"});
  expectError([&] { c.getInt("torch_dtype", 0); }, {f, "field 'torch_dtype' is \"bfloat16\" (string), not an integer"});
  expectError([&] { c.getBool("hidden_size"); }, {f, "'hidden_size' is 4096", "not true or false"});
  expectError([&] { c.getString("architectures"); }, {f, "'architectures' is [\"LlamaForCausalLM\"] (array)"});
  expectError([&] { c.getIntList("architectures"); }, {f, "not an array of integers"});
  expectError([&] { c.getObject("hidden_size"); }, {f, "not an object"});
  expectError([&] { c.getObject("rope_scaling").getInt("original_max_position_embeddings"); },
              {f + ": rope_scaling", "field 'original_max_position_embeddings' is missing"});
}

TEST_F(Config, WritesAndReadsBack) {
  ConfigJson c;
  c.set("hidden_size", 64);
  c.set("rms_norm_eps", 1e-6);
  c.set("model_type", "llama");
  c.set("eos_token_id", std::vector<int64_t>{1, 2});
  c.json()["rope_scaling"] = nullptr;
  c.write(path("config.json"));
  const ConfigJson back = ConfigJson::read(path("config.json"));
  EXPECT_EQ(back.json(), c.json());
  EXPECT_EQ(back.getDouble("rms_norm_eps"), 1e-6);
  EXPECT_EQ(readFile(path("config.json")).back(), '\n');
  EXPECT_FALSE(std::filesystem::exists(path("config.json.tmp")));
}

TEST_F(Config, BadFiles) {
  const std::string f = path("config.json");
  expectError([&] { ConfigJson::read(f); }, {f, "no such file"});
  writeFile(f, "{\"hidden_size\": 4096,");
  expectError([&] { ConfigJson::read(f); }, {f, "is not valid JSON"});
  writeFile(f, "[1, 2]");
  expectError([&] { ConfigJson::read(f); }, {f, "is JSON array, not an object"});
  writeFile(f, R"({"hidden_size": 4096, "hidden_size": 2048})");
  expectError([&] { ConfigJson::read(f); }, {f, "key 'hidden_size' appears twice"});
}

}  // namespace
