// src/models: the Llama (and GPT) language-model chunk on one rank.
// - Golden: tessera's Llama gives the same logits, loss and every parameter gradient as an
//   independent PyTorch Llama (tests/models/torch_llama.py, loaded with tessera's weights by
//   their unsharded names) on the same batch, within fp32 tolerance: grouped-query attention,
//   Llama-3 rotary scaling and tied embeddings in one variant, multi-head attention, plain rotary
//   positions and an untied head in the other; each also with the fused ops (ChunkOptions::
//   fusedKernels: the kernels' CPU references, and the fused cross-entropy).
// - Generation golden: tessera's greedy continuation with the KV cache (models/generate.h) equals
//   that of the PyTorch Llama rerunning the whole sequence each step (generate_golden.py), and
//   so does every step's logits within fp32 tolerance, for both variants.
// - Recompute: full and selective recomputation give the gradients of the run without
//   (bitwise), and the activations alive between forward and backward, counted by a CPU
//   allocator that tracks live bytes, shrink: full < selective < none.
// - Presets: the parameter counts of the Llama 3.2 1B and Llama 3 8B shapes.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/version.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "harness/multiprocess.h"
#include "tessera/models/generate.h"
#include "tessera/models/lm.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::testing;

namespace {

ModelConfig goldenConfig(int variant) {
  ModelConfig c = presetConfig("llama-tiny");
  c.d = 64, c.layers = 2, c.heads = 4, c.ffn = 96, c.vocab = 128, c.seqLen = 16;
  if (variant == 0) {
    c.kvHeads = 2, c.tiedEmbeddings = true, c.ropeTheta = 500000;
    c.ropeScaling = {true, 4, 1, 4, 16};  // original 16 positions: every regime of the scaling is hit
  } else {
    c.kvHeads = 4, c.tiedEmbeddings = false, c.ropeTheta = 10000;
  }
  return c;
}

LmChunk wholeModel(const ModelConfig& c, const CommPtr& g, nn::Recompute r = nn::Recompute::None, bool fused = false) {
  LayerOptions o;
  o.recompute = r;
  o.seed = 11;
  o.fusedKernels = fused;
  return LmChunk(c, g, nullptr, ChunkRange::whole(c), o);
}

std::pair<at::Tensor, at::Tensor> batch(const ModelConfig& c, int64_t b, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return {at::randint(0, c.vocab, {b, c.seqLen}, gen, at::kLong), at::randint(0, c.vocab, {b, c.seqLen}, gen, at::kLong)};
}

// (unsharded name, parameter values, gradient) for every piece of the chunk (tp 1: whole tensors).
std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> namedGrads(LmChunk& m) {
  std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> out;
  const auto params = m->params();
  for (const auto& piece : m->pieces()) {
    for (const auto& p : params) {
      const int64_t o = piece.local.storage_offset();
      if (!piece.local.is_alias_of(p.tensor) || o < p.tensor.storage_offset() ||
          o >= p.tensor.storage_offset() + p.tensor.numel())
        continue;
      auto g = p.tensor.grad();
      out.emplace_back(piece.name, piece.local.clone(),
                       g.as_strided(piece.local.sizes(), piece.local.strides(),
                                    g.storage_offset() + (o - p.tensor.storage_offset())).clone());
    }
  }
  return out;
}

TESSERA_WORKER(llama_golden_dump) {
  auto ctx = initWorker(w);
  const auto bar = w.arg.find('|'), bar2 = w.arg.rfind('|');
  const std::string file = w.arg.substr(0, bar);
  const int variant = std::stoi(w.arg.substr(bar + 1, bar2 - bar - 1));
  const bool fused = w.arg.substr(bar2 + 1) == "fused";
  const auto c = goldenConfig(variant);
  auto m = wholeModel(c, ctx.world, nn::Recompute::None, fused);
  auto [tokens, targets] = batch(c, 3, 5);
  auto logits = m->forward(tokens);  // [T, b, V]
  // Taken before backward: the fused loss writes its gradient over the logits (models/lm.h).
  const auto logitsOut = logits.detach().transpose(0, 1).contiguous();
  auto loss = lmLoss(logits, targets, ctx.world, c.vocab, fused);
  loss.backward();
  c10::Dict<std::string, at::Tensor> d;
  d.insert("tokens", tokens);
  d.insert("targets", targets);
  d.insert("logits", logitsOut);
  d.insert("loss", loss.detach());
  const auto& s = c.ropeScaling;
  d.insert("config", at::tensor({double(c.d), double(c.layers), double(c.heads), double(c.kvH()), double(c.ffnSize()),
                                 double(c.vocab), double(c.seqLen), double(c.tiedEmbeddings), c.ropeTheta,
                                 double(s.enabled), s.factor, s.lowFreqFactor, s.highFreqFactor,
                                 double(s.originalMaxPositions), c.normEps},
                                at::kDouble));
  int n = 0;
  for (const auto& [name, value, grad] : namedGrads(m)) {
    d.insert("param." + name, value);
    d.insert("grad." + name, grad);
    ++n;
  }
  WCHECK(n == (variant == 0 ? 1 + 2 * 9 + 1 : 1 + 2 * 9 + 2), "{} named tensors", n);
  const auto bytes = torch::pickle_save(c10::IValue(d));
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void expectGolden(const char* ops) {
  for (int variant : {0, 1}) {
    const auto file = std::filesystem::temp_directory_path() / fmt::format("tessera-golden-{}-{}.pt", ::getpid(), variant);
    expectAllOk(
        runWorkers("llama_golden_dump", {.ranks = 1, .arg = fmt::format("{}|{}|{}", file.string(), variant, ops)}));
    const auto cmd = fmt::format("/usr/bin/python3 {}/tests/models/llama_golden.py {}", TESSERA_SOURCE_DIR, file.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (" << ops << " ops, variant " << variant << ")";
    std::filesystem::remove(file);
  }
}

TEST(LlamaGolden, MatchesAnIndependentPyTorchLlama) { expectGolden("aten"); }

TEST(LlamaGolden, FusedOpsMatchAnIndependentPyTorchLlama) { expectGolden("fused"); }

// The weights by unsharded name (tp 1: whole tensors), the prompt, the greedy continuation and
// each step's logits, for generate_golden.py.
TESSERA_WORKER(llama_generate_golden_dump) {
  auto ctx = initWorker(w);
  const auto bar = w.arg.find('|');
  const auto c = goldenConfig(std::stoi(w.arg.substr(bar + 1)));
  auto m = wholeModel(c, ctx.world);
  {  // the blocks' matrices x6: attention and the MLP, not the token's own embedding, pick the next token
    at::NoGradGuard ng;
    for (auto& p : m->params()) {
      if (p.name.rfind("blocks.", 0) == 0 && p.tensor.dim() == 2) p.tensor.mul_(6);
    }
  }
  const auto prompt = batch(c, 1, 9).first.narrow(1, 0, 4).contiguous();
  GenerateOptions o;
  o.maxNewTokens = c.seqLen - 4;
  o.keepLogits = true;
  const auto g = generate(*m, prompt, o);
  c10::Dict<std::string, at::Tensor> d;
  d.insert("prompt", prompt);
  d.insert("tokens", at::tensor(g.tokens[0], at::kLong));
  d.insert("logits", at::stack(g.logits).squeeze(1));  // [steps, V]
  for (const auto& piece : m->pieces()) d.insert("param." + piece.name, piece.local.clone());
  const auto bytes = torch::pickle_save(c10::IValue(d));
  std::ofstream(w.arg.substr(0, bar), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(LlamaGolden, GreedyGenerationMatchesAnIndependentPyTorchLlama) {
  for (int variant : {0, 1}) {
    const auto file = std::filesystem::temp_directory_path() / fmt::format("tessera-gen-golden-{}-{}.pt", ::getpid(), variant);
    expectAllOk(runWorkers("llama_generate_golden_dump", {.ranks = 1, .arg = fmt::format("{}|{}", file.string(), variant)}));
    const auto cmd = fmt::format("/usr/bin/python3 {}/tests/models/generate_golden.py {} {}", TESSERA_SOURCE_DIR,
                                 file.string(), variant);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::filesystem::remove(file);
  }
}

// Live CPU bytes, counted by an allocator that replaces the default one (installed in a worker).
struct CountingAllocator final : c10::Allocator {
  static std::atomic<int64_t> live;
  static std::mutex mu;
  static std::unordered_map<void*, size_t> sizes;
  static void release(void* p) {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = sizes.find(p);
      live -= static_cast<int64_t>(it->second);
      sizes.erase(it);
    }
    c10::free_cpu(p);
  }
#if TORCH_VERSION_MAJOR >= 2  // non-const since LibTorch 2.3 (the GPU image's 2.11); const in 1.13
  at::DataPtr allocate(size_t n) override {
#else
  at::DataPtr allocate(size_t n) const override {
#endif
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> lock(mu);
      sizes[p] = n;
      live += static_cast<int64_t>(n);
    }
    return {p, p, &release, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &release; }
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif
};
std::atomic<int64_t> CountingAllocator::live{0};
std::mutex CountingAllocator::mu;
std::unordered_map<void*, size_t> CountingAllocator::sizes;

TESSERA_WORKER(recompute_equal_and_smaller) {
  auto ctx = initWorker(w);
  static CountingAllocator counter;
  c10::SetCPUAllocator(&counter, /*priority=*/100);
  // llama-fused: tessera's kernels (CPU references), where selective also drops the SwiGLU product
  // (nn::swigluLinear recomputes it): gradients equal up to the GEMMs' summation order.
  for (const std::string name : {"llama", "llama-fused", "gpt-rope", "gpt-learned"}) {
    const bool fused = name == "llama-fused";
    ModelConfig c = presetConfig(name.rfind("llama", 0) == 0 ? "llama-tiny" : "tiny");
    c.layers = 4, c.vocab = 256, c.seqLen = 64;
    if (name == "gpt-rope") c.positions = Positions::Rope;
    const auto [tokens, targets] = batch(c, 8, 3);
    std::vector<std::vector<std::tuple<std::string, at::Tensor, at::Tensor>>> grads;
    std::vector<int64_t> activations;
    for (auto r : {nn::Recompute::None, nn::Recompute::Selective, nn::Recompute::Full}) {
      auto m = wholeModel(c, ctx.world, r, fused);
      const int64_t before = counter.live;
      auto loss = lmLoss(m->forward(tokens), targets, ctx.world, c.vocab);
      activations.push_back(counter.live - before);
      loss.backward();
      grads.push_back(namedGrads(m));
    }
    fmt::print("{}: bytes alive between forward and backward: none {}, selective {}, full {}\n", name, activations[0],
               activations[1], activations[2]);
    WCHECK(activations[2] < activations[1] && activations[1] < activations[0],
           "{}: activations none {} selective {} full {} (expected decreasing)", name, activations[0], activations[1],
           activations[2]);
    WCHECK(activations[2] * 2 < activations[0], "{}: full recompute keeps {} of {} bytes", name, activations[2],
           activations[0]);
    for (size_t k = 1; k < grads.size(); ++k) {
      WCHECK(grads[k].size() == grads[0].size() && !grads[0].empty(), "{}: {} vs {} gradients", name, grads[k].size(),
             grads[0].size());
      for (size_t i = 0; i < grads[0].size(); ++i) {
        const auto &a = std::get<2>(grads[k][i]), &b = std::get<2>(grads[0][i]);
        WCHECK(fused ? at::allclose(a, b, 1e-5, 1e-7) : at::equal(a, b),
               "{}: recompute mode {}: gradient of {} differs (largest difference {})", name, k,
               std::get<0>(grads[0][i]), (a - b).abs().max().item<double>());
      }
    }
  }
}

TEST(Recompute, SameGradientsFewerActivations) {
  const auto r = runWorkers("recompute_equal_and_smaller", {.ranks = 1, .timeout = std::chrono::seconds(120)});
  expectAllOk(r);
  std::istringstream lines(r[0].output);
  for (std::string l; std::getline(lines, l);) {
    if (l.find("bytes alive") != std::string::npos) fmt::print("{}\n", l);
  }
}

TEST(Presets, LlamaShapesHaveTheirParameterCounts) {
  EXPECT_EQ(paramCount(presetConfig("llama3-1b")), 1235814400);  // Llama 3.2 1B
  EXPECT_EQ(paramCount(presetConfig("llama3-8b")), 8030261248);  // Llama 3 8B
  EXPECT_EQ(paramCount(presetConfig("735m")), 735375360);        // the anchors' GPT-735M
  // FLOPs: 6 x (blocks + head) + 12 L d T; GQA and SwiGLU through the block's parameters.
  const auto c = presetConfig("llama3-1b");
  EXPECT_DOUBLE_EQ(flopsPerToken(c), 6.0 * (16.0 * 60821504 + 128256.0 * 2048) + 12.0 * 16 * 2048 * 2048);
  EXPECT_THROW(presetConfig("llama4"), Error);
  auto bad = presetConfig("llama-tiny");
  bad.kvHeads = 3;
  EXPECT_THROW(validate(bad), Error);
}

}  // namespace
