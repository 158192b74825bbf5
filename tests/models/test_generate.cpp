// src/models generation (kv_cache.h, sample.h, generate.h, model_source.h, config_json.h):
// - The KV cache against the full forward: greedy decoding with the cache gives exactly the
//   tokens of greedy decoding that reruns the whole sequence each step, and the cached logits of
//   every position (prefill in pieces, then one token at a time) equal the full forward's within
//   fp32 tolerance: the Llama (GQA tied, multi-head untied, Llama-3 rotary scaling) and the GPT
//   (learned, rotary and no positions).
// - tp 2 against tp 1: the same tokens (greedy and sampled) and logits, kv heads split and
//   replicated, and a checkpoint saved at tp 2 loaded at tp 1 (model_source.h) continues alike.
// - Sampling: a seed reproduces, top-p 1e-9 is greedy, top-p keeps the nucleus only.
// - Bad input: ids outside the vocabulary, too many positions for learned positions, top-p outside
//   (0, 1], pp > 1, a directory without a model, an HF directory, a checkpoint without its config.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/multiprocess.h"
#include "tessera/models/config_json.h"
#include "tessera/models/generate.h"
#include "tessera/models/kv_cache.h"
#include "tessera/hf/model_source.h"
#include "tessera/parallel/tensor/mappings.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::hf;
using namespace tessera::testing;

namespace {

// Small shapes of every kind the cache handles.
ModelConfig variant(const std::string& name) {
  ModelConfig c = presetConfig(name.rfind("llama", 0) == 0 ? "llama-tiny" : "tiny");
  c.layers = 2, c.vocab = 64, c.seqLen = 24;
  if (name == "llama-mha-untied") c.kvHeads = 4, c.tiedEmbeddings = false;
  if (name == "llama-kv1") c.kvHeads = 1;
  if (name == "llama-scaled") c.ropeTheta = 500000, c.ropeScaling = {true, 4, 1, 4, 16};
  if (name == "gpt-rope") c.positions = Positions::Rope;
  if (name == "gpt-none") c.positions = Positions::None;
  return c;
}

// The blocks' matrices scaled up from their initialisation (x6), so that attention and the MLP,
// not the token's own embedding, decide the next token: the greedy continuations then vary.
LmChunk model(const ModelConfig& c, const CommPtr& tp, uint64_t seed = 3) {
  LayerOptions o;
  o.seed = seed;
  auto m = LmChunk(c, tp, familyGroup(c, tp), ChunkRange::whole(c), o);
  m->eval();
  at::NoGradGuard ng;
  for (auto& p : m->params()) {
    if (p.name.rfind("blocks.", 0) == 0 && p.tensor.dim() == 2) p.tensor.mul_(6);
  }
  return m;
}

at::Tensor prompt(const ModelConfig& c, int64_t b, int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randint(0, c.vocab, {b, n}, gen, at::kLong);
}

// The full forward's logits [b, n, V] of seq [b, n] (padded to seqLen: causal, so the padding
// changes nothing before it).
at::Tensor fullLogits(LmChunk& m, const at::Tensor& seq) {
  at::NoGradGuard ng;
  const int64_t n = seq.size(1);
  auto padded = at::zeros({seq.size(0), m->cfg.seqLen}, at::kLong);
  padded.narrow(1, 0, n).copy_(seq);
  return tp::gatherLastDim(m->forward(padded), m->tp).narrow(0, 0, n).transpose(0, 1);
}

double relDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

TESSERA_WORKER(generate_cache_matches_full_forward) {
  auto ctx = initWorker(w);
  for (const std::string name :
       {"llama-gqa-tied", "llama-mha-untied", "llama-scaled", "gpt-learned", "gpt-rope", "gpt-none"}) {
    const auto c = variant(name);
    auto m = model(c, ctx.world);
    // (b) Logits of every position: prefill 5, then 3 at once (a masked block at an offset), then 1 by 1.
    const auto seq = prompt(c, 2, 12, 7);
    const auto want = fullLogits(m, seq);
    auto cache = makeKvCache(*m, 2, 12);
    int64_t at = 0;
    for (int64_t n : {5, 3, 1, 1, 1, 1}) {
      auto got = forwardCached(*m, seq.narrow(1, at, n), cache, /*lastOnly=*/false);
      const double d = relDiff(got, want.narrow(1, at, n));
      WCHECK(d < 1e-5, "{}: logits of positions {}..{}: relative difference {:.3e}", name, at, at + n - 1, d);
      at += n;
    }
    WCHECK(cache.length == 12, "{}: cache length {}", name, cache.length);
    // (a) Greedy with the cache = greedy by rerunning the whole sequence each step.
    GenerateOptions o;
    o.maxNewTokens = 10;
    o.keepLogits = true;
    const auto p = prompt(c, 1, 4, 11);
    const auto g = generate(*m, p, o);
    auto s = p.clone();
    for (int64_t step = 0; step < o.maxNewTokens; ++step) {
      auto last = fullLogits(m, s).select(1, s.size(1) - 1);  // [1, V]
      const int64_t id = last.argmax(1).item<int64_t>();
      WCHECK(g.tokens[0].size() == 10 && g.tokens[0][step] == id, "{}: step {}: cached greedy {} vs full {}", name,
             step, g.tokens[0].size() > size_t(step) ? g.tokens[0][step] : -1, id);
      WCHECK(relDiff(g.logits[step], last) < 1e-5, "{}: step {} logits differ", name, step);
      s = at::cat({s, at::tensor({id}, at::kLong).view({1, 1})}, 1);
    }
    // (d) A seed reproduces; top-p 1e-9 is greedy at any temperature.
    GenerateOptions r = o;
    r.sampling = {0.9, 0.95, 5};
    fmt::print("{}: greedy continuation {}\n", name, fmt::join(g.tokens[0], ","));
    const auto a = generate(*m, p, r), b = generate(*m, p, r);
    WCHECK(a.tokens == b.tokens, "{}: the same seed drew other tokens", name);
    r.sampling = {0.7, 1e-9, 5};
    WCHECK(generate(*m, p, r).tokens == g.tokens, "{}: top-p 1e-9 is not greedy", name);
  }
}

TEST(Generate, CacheMatchesTheFullForward) {
  const auto r = runWorkers("generate_cache_matches_full_forward", {.ranks = 1, .timeout = std::chrono::seconds(120)});
  expectAllOk(r);
  std::istringstream lines(r[0].output);
  for (std::string l; std::getline(lines, l);) {
    if (l.find("greedy continuation") != std::string::npos) fmt::print("{}\n", l);
  }
}

// (c) tp 2 = tp 1 (each rank also builds the tp 1 model over a group of its own), then through a
// checkpoint saved at tp 2 and loaded at tp 1.
TESSERA_WORKER(generate_tp2_matches_tp1) {
  auto ctx = initWorker(w);
  auto self = ctx.world->split(w.rank, 0, "self");
  const auto dir = w.arg;
  for (const std::string name : {"llama-gqa-tied", "llama-kv1", "llama-mha-untied", "gpt-rope"}) {
    const auto c = variant(name);
    auto m2 = model(c, ctx.world), m1 = model(c, self);
    const auto p = prompt(c, 2, 5, 13);
    for (const SamplingOptions s : {SamplingOptions{}, SamplingOptions{0.9, 0.9, 4}}) {
      GenerateOptions o;
      o.maxNewTokens = 8;
      o.keepLogits = true;
      o.sampling = s;
      const auto g2 = generate(*m2, p, o), g1 = generate(*m1, p, o);
      WCHECK(g2.tokens == g1.tokens, "{}: temperature {}: tp 2 drew other tokens than tp 1", name, s.temperature);
      for (size_t k = 0; k < g1.logits.size(); ++k) {
        WCHECK(relDiff(g2.logits[k], g1.logits[k]) < 1e-5, "{}: step {}: tp 2 logits differ", name, k);
      }
    }
    // Saved at tp 2 with its config, opened from the directory alone at tp 1.
    const auto ckpt = fmt::format("{}/{}", dir, name);
    checkpoint::save(ckpt, m2->pieces(), *ctx.world, 1, {{"model", c.signature()}, {"model_config", configToJson(c)}});
    const auto src = openModel(ckpt);
    WCHECK(src.config.signature() == c.signature() && src.format == "tessera", "{}: opened as {}", name,
           src.config.signature());
    auto loaded = loadWholeModel(src, self, at::kCPU);
    GenerateOptions o;
    o.maxNewTokens = 8;
    WCHECK(generate(*loaded, p, o).tokens == generate(*m2, p, o).tokens, "{}: the reloaded model continues otherwise",
           name);
  }
}

TEST(Generate, Tp2MatchesTp1AndReloads) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tessera-generate-{}", ::getpid());
  expectAllOk(runWorkers("generate_tp2_matches_tp1", {.ranks = 2, .timeout = std::chrono::seconds(120),
                                                      .arg = dir.string()}));
  std::filesystem::remove_all(dir);
}

TESSERA_WORKER(generate_bad_input) {
  auto ctx = initWorker(w);
  const auto dir = w.arg;
  auto c = variant("gpt-learned");
  auto m = model(c, ctx.world);
  GenerateOptions o;
  auto bad = at::tensor({1, 64, 2}, at::kLong).view({1, 3});
  expectErrorContaining([&] { generate(*m, bad, o); }, {"prompt id 64", "vocabulary [0, 64)"});
  o.maxNewTokens = 22;
  expectErrorContaining([&] { generate(*m, prompt(c, 1, 3, 1), o); }, {"25 positions", "24 learned positions"});
  o.maxNewTokens = 4;
  o.sampling.topP = 1.5;
  expectErrorContaining([&] { generate(*m, prompt(c, 1, 3, 1), o); }, {"top-p", "1.5"});
  o.sampling.topP = 0;
  expectErrorContaining([&] { generate(*m, prompt(c, 1, 3, 1), o); }, {"top-p", "(0, 1]"});
  auto stage = LmChunk(c, ctx.world, nullptr, ChunkRange{0, 2, 0, 1}, LayerOptions{});
  expectErrorContaining([&] { makeKvCache(*stage, 1, 4); }, {"pipeline inference is not supported"});
  // Directories: none, an HF one without a model config, a tessera checkpoint of an older tessera (no model_config).
  expectErrorContaining([&] { openModel(dir + "/missing"); }, {"missing", "no such directory"});
  std::filesystem::create_directories(dir + "/hf");
  std::ofstream(dir + "/hf/config.json") << "{}";
  expectErrorContaining([&] { openModel(dir + "/hf"); }, {"hf/config.json", "field 'hidden_size' is missing"});
  checkpoint::save(dir + "/old", m->pieces(), *ctx.world, 1, {{"model", c.signature()}});
  expectErrorContaining([&] { openModel(dir + "/old"); }, {"no model configuration", "--model PRESET"});
  auto other = c;
  other.d = 128;
  expectErrorContaining([&] { openModel(dir + "/old", other); }, {"another model", "d 128"});
  WCHECK(openModel(dir + "/old", c).config.signature() == c.signature(), "the flags' config is not used");
}

TEST(Generate, BadInputIsRefused) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tessera-generate-bad-{}", ::getpid());
  expectAllOk(runWorkers("generate_bad_input", {.ranks = 1, .arg = dir.string()}));
  std::filesystem::remove_all(dir);
}

TEST(Sampler, SeedReproducesAndTopPKeepsTheNucleus) {
  auto gen = at::detail::createCPUGenerator(1);
  const auto logits = at::randn({4, 50}, gen) * 3;
  Sampler a({1.0, 1.0, 9}), b({1.0, 1.0, 9}), c({1.0, 1.0, 10});
  std::vector<at::Tensor> da, db, dc;
  for (int i = 0; i < 20; ++i) da.push_back(a.next(logits)), db.push_back(b.next(logits)), dc.push_back(c.next(logits));
  EXPECT_TRUE(at::equal(at::stack(da), at::stack(db)));
  EXPECT_FALSE(at::equal(at::stack(da), at::stack(dc)));
  Sampler greedy({0.8, 1e-9, 3});
  EXPECT_TRUE(at::equal(greedy.next(logits), logits.argmax(1)));
  EXPECT_TRUE(at::equal(Sampler({}).next(logits), logits.argmax(1)));
  // Probabilities 0.5, 0.3, 0.2 (ids 2, 0, 1): top-p 0.6 keeps ids 2 and 0, top-p 0.45 id 2 alone.
  const auto three = at::log(at::tensor({0.3, 0.2, 0.5}, at::kDouble)).view({1, 3});
  Sampler p6({1.0, 0.6, 1}), p5({1.0, 0.45, 1}), all({1.0, 1.0, 1});
  int counts[3] = {0, 0, 0}, seen1 = 0;
  for (int i = 0; i < 400; ++i) {
    const int64_t x = p6.next(three).item<int64_t>();
    EXPECT_NE(x, 1);
    EXPECT_EQ(p5.next(three).item<int64_t>(), 2);
    ++counts[all.next(three).item<int64_t>()];
    seen1 += x == 0;
  }
  EXPECT_GT(seen1, 100);  // 0.3 / 0.8 of 400 = 150 expected
  EXPECT_GT(counts[1], 40);  // 0.2 of 400 = 80 expected
  EXPECT_THROW(Sampler({-1, 1, 0}), Error);
  EXPECT_THROW(Sampler({1, 0, 0}), Error);
}

TEST(ConfigJson, RoundTripsEveryFieldAndNamesBadInput) {
  auto scaled = presetConfig("llama3-1b");
  scaled.normEps = 1e-6;
  auto moe = presetConfig("moe-tiny");  // every MoE field away from its default
  moe.moe = {.experts = 6, .topK = 3, .expertFfn = 32, .sharedFfn = 16, .score = RouterScore::Sigmoid,
             .normTopK = false, .routedScale = 2.5, .capacityFactor = 1.25, .auxLossCoef = 0.01, .zLossCoef = 1e-3,
             .biasUpdateRate = 1e-3, .firstDense = 1, .sparseStep = 2, .denseLayers = {3}};
  moe.headSize = 32, moe.qkNorm = QkNorm::Whole;
  for (auto c : {presetConfig("tiny"), presetConfig("735m"), presetConfig("llama-tiny"), scaled, moe,
                 presetConfig("qwen3-30b-a3b"), presetConfig("olmoe-1b-7b")}) {
    const auto back = configFromJson(configToJson(c));
    EXPECT_EQ(configToJson(back), configToJson(c));
    EXPECT_EQ(back.signature(), c.signature());
    EXPECT_EQ(back.ropeTheta, c.ropeTheta);
    EXPECT_EQ(back.normEps, c.normEps);
    EXPECT_EQ(back.seqLen, c.seqLen);
    EXPECT_EQ(back.ropeScaling.enabled, c.ropeScaling.enabled);
    EXPECT_EQ(back.ropeScaling.factor, c.ropeScaling.factor);
    EXPECT_EQ(back.ropeScaling.originalMaxPositions, c.ropeScaling.originalMaxPositions);
  }
  auto expectError = [](const std::string& json, const std::string& part) {
    try {
      configFromJson(json);
      ADD_FAILURE() << "no error for " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const std::string ok = R"("d": 64, "layers": 2, "heads": 4, "vocab": 64, "seqLen": 8, "positions": "rope")";
  expectError("{" + ok + "}", "'arch' is missing");
  expectError(R"({"arch": "gpt", "layers": 2})", "'d' is missing");
  expectError(R"({"arch": "bert", )" + ok + "}", "'arch' is 'bert'");
  expectError(R"({"arch": "gpt", "colour": 1, )" + ok + "}", "unknown field 'colour'");
  expectError(R"({"arch": "gpt", "d": "64", "layers": 2})", "'d' has the wrong type");
  expectError("{not json", "not JSON");
  expectError(R"({"arch": "llama", "kvHeads": 3, )" + ok + "}", "kv heads");
  expectError(R"({"arch": "llama", "qkNorm": "rms", )" + ok + "}", "rms");
  expectError(R"({"arch": "llama", "moe": {"experts": 4, "topK": 2, "colour": 1}, )" + ok + "}",
              "unknown moe field 'colour'");
}

}  // namespace
