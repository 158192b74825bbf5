// The Hugging Face families of the Llama block (Qwen3, Mixtral, Qwen3-MoE, OLMoE: q/k norm per
// head and over the whole projection, an explicit head size, experts, dense layers):
// - Golden: a tiny model of each family against an independent PyTorch implementation with
//   transformers' conventions (tests/hf/hf_families.py), which reads tessera's weights by their HF
//   names (hf/families.h) and the config.json tessera writes: logits and every gradient.
// - Tensor parallel: the q/k norms over tp 2 (per head and whole, kv heads split and replicated,
//   with sequence parallel, recompute and the fused ops) against one process: loss and every gradient.
// - Generation: tessera's greedy continuation of a tiny HF directory of each family (written by
//   hf_families.py; the KV cache's decode path with q/k norms and experts) and its logits equal
//   the reference's rerun of the whole sequence.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "harness/multiprocess.h"
#include "hf/families.h"
#include "hf/llama.h"
#include "tessera/hf/model_source.h"
#include "tessera/models/generate.h"
#include "tessera/models/lm.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::testing;

namespace {

ModelConfig familyConfig(const std::string& f) {
  ModelConfig c = presetConfig("llama-tiny");
  c.d = 32, c.layers = 2, c.heads = 4, c.kvHeads = 2, c.ffn = 48, c.vocab = 64, c.seqLen = 8;
  c.tiedEmbeddings = false, c.ropeTheta = 1e6, c.normEps = 1e-6;
  if (f == "qwen3" || f == "qwen3_moe") c.headSize = 16, c.qkNorm = QkNorm::PerHead;
  if (f == "qwen3_moe") c.layers = 3, c.moe = {.experts = 6, .topK = 2, .expertFfn = 16, .denseLayers = {1}};
  if (f == "mixtral") c.ffn = 24, c.tiedEmbeddings = true, c.moe = {.experts = 4, .topK = 2};
  if (f == "olmoe")
    c.kvHeads = 4, c.ffn = 16, c.qkNorm = QkNorm::Whole, c.moe = {.experts = 6, .topK = 3, .normTopK = false};
  return c;
}

// The unsharded tensor `name` drawn from its own generator: vectors 1 + 0.3 N(0, 1), matrices
// 2 N(0, 1) / sqrt(columns) (sharp attention and routing, so every convention shows).
at::Tensor drawn(const std::string& name, const std::vector<int64_t>& shape) {
  auto gen = at::detail::createCPUGenerator(std::hash<std::string>{}(name) % 1000003);
  auto t = at::randn(shape, gen);
  return shape.size() == 1 ? 1 + 0.3 * t : 2 * t / std::sqrt(static_cast<double>(shape.back()));
}

at::Tensor box(at::Tensor t, const std::vector<int64_t>& offset, at::IntArrayRef sizes) {
  for (size_t i = 0; i < offset.size(); ++i) t = t.narrow(static_cast<int64_t>(i), offset[i], sizes[i]);
  return t;
}

LmChunk drawnModel(const ModelConfig& c, const CommPtr& tp, LayerOptions o = {}) {
  auto m = LmChunk(c, tp, familyGroup(c, tp), ChunkRange::whole(c), o);
  at::NoGradGuard ng;
  for (auto& p : m->pieces()) {
    if (!p.state) p.local.copy_(box(drawn(p.name, p.globalShape), p.offset, p.local.sizes()));
  }
  return m;
}

// The gradients as pieces (name, box): each parameter's values swapped with its gradient while
// pieces() reads them.
std::vector<checkpoint::Piece> gradPieces(LmChunk& m) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> saved;
  for (auto& p : m->params()) {
    saved.push_back(p.tensor.detach().clone());
    p.tensor.detach().copy_(p.tensor.grad().defined() ? p.tensor.grad() : at::zeros_like(p.tensor));
  }
  auto out = m->pieces();
  for (auto& p : out) p.local = p.local.clone();
  size_t k = 0;
  for (auto& p : m->params()) p.tensor.detach().copy_(saved[k++]);
  return out;
}

TESSERA_WORKER(families_golden_dump) {
  auto ctx = initWorker(w);
  const auto bar = w.arg.find('|');
  const std::string file = w.arg.substr(0, bar), family = w.arg.substr(bar + 1);
  const auto c = familyConfig(family);
  WCHECK(std::string(hf::modelType(hf::familyOf(c))) == family, "{} exports as {}", family,
         hf::modelType(hf::familyOf(c)));
  auto m = drawnModel(c, ctx.world);
  auto gen = at::detail::createCPUGenerator(3);
  const auto tokens = at::randint(0, c.vocab, {2, c.seqLen}, gen, at::kLong);
  auto logits = m->forward(tokens).transpose(0, 1);  // [b, T, V]
  const auto g = at::randn(logits.sizes(), gen);
  (logits * g).sum().backward();
  c10::Dict<std::string, at::Tensor> d;
  d.insert("tokens", tokens);
  d.insert("logits", logits.detach().contiguous());
  d.insert("G", g);
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> byName;  // values, gradients
  const auto values = m->pieces();
  const auto grads = gradPieces(m);
  for (size_t i = 0; i < values.size(); ++i) byName[values[i].name] = {values[i].local, grads[i].local};
  for (const auto& t : hf::tensorMap(c)) {
    for (size_t e = 0; e < t.hf.size(); ++e) {
      const auto& [v, gr] = byName.at(t.name);
      d.insert("w." + t.hf[e], t.hf.size() == 1 ? v : v[static_cast<int64_t>(e)]);
      d.insert("g." + t.hf[e], t.hf.size() == 1 ? gr : gr[static_cast<int64_t>(e)]);
    }
  }
  hf::llamaConfigToHf(c, "float32").write(file + ".json");
  const auto bytes = torch::pickle_save(c10::IValue(d));
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST(FamiliesGolden, MatchIndependentHuggingFaceStyleModels) {
  std::string pairs;
  std::vector<std::string> files;
  for (const char* family : {"qwen3", "mixtral", "qwen3_moe", "olmoe"}) {
    const auto file =
        std::filesystem::temp_directory_path() / fmt::format("tessera-family-{}-{}.pt", ::getpid(), family);
    expectAllOk(runWorkers("families_golden_dump", {.ranks = 1, .arg = fmt::format("{}|{}", file.string(), family)}));
    pairs += fmt::format(" {} {}.json", file.string(), file.string());
    files.push_back(file.string());
  }
  const auto cmd = fmt::format("/usr/bin/python3 {}/tests/hf/hf_families.py golden{}", TESSERA_SOURCE_DIR, pairs);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (const auto& f : files) std::filesystem::remove(f), std::filesystem::remove(f + ".json");
}

namespace {

// qk-norm variants over tp 2 against the same model on one rank (a group of one split from the world).
TESSERA_WORKER(families_qk_norm_tp) {
  auto ctx = initWorker(w);
  auto solo = ctx.world->split(ctx.world->rank(), 0, "solo");
  auto gen = at::detail::createCPUGenerator(4);
  struct Case {
    QkNorm norm;
    int64_t kv;
    bool sp;
    nn::Recompute r;
    bool fused;  // the fused ops' CPU references (norms with the residual adds)
  };
  for (const auto& k : {Case{QkNorm::PerHead, 1, false, nn::Recompute::None, false},
                        Case{QkNorm::Whole, 1, true, nn::Recompute::Selective, true},
                        Case{QkNorm::Whole, 2, false, nn::Recompute::Full, false},
                        Case{QkNorm::PerHead, 2, true, nn::Recompute::None, true}}) {
    auto c = familyConfig("olmoe");
    c.qkNorm = k.norm, c.kvHeads = k.kv, c.moe = {};
    const auto tokens = at::randint(0, c.vocab, {2, c.seqLen}, gen, at::kLong);
    const auto targets = at::randint(0, c.vocab, {2, c.seqLen}, gen, at::kLong);
    auto one = drawnModel(c, solo);
    const auto loss1 = lmLoss(one->forward(tokens), targets, solo, c.vocab);
    loss1.backward();
    LayerOptions o;
    o.sequenceParallel = k.sp, o.recompute = k.r, o.fusedKernels = k.fused;
    auto two = drawnModel(c, ctx.world, o);
    const auto loss2 = lmLoss(two->forward(tokens), targets, ctx.world, c.vocab);
    loss2.backward();
    WCHECK(std::abs(loss1.item<double>() - loss2.item<double>()) < 1e-5, "{}: loss {} on one rank, {} on tp 2",
           toString(k.norm), loss1.item<double>(), loss2.item<double>());
    std::map<std::string, at::Tensor> full;
    for (auto& p : gradPieces(one)) full[p.name] = p.local;
    for (auto& p : gradPieces(two)) {
      const auto want = box(full.at(p.name), p.offset, p.local.sizes());
      const double diff = (p.local - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
      WCHECK(diff <= 1e-4 * scale + 1e-7, "{} kv {} sp {}: gradient of {} differs by {} (largest {})", toString(k.norm),
             k.kv, k.sp, p.name, diff, scale);
    }
  }
}

}  // namespace

TEST(FamiliesQkNorm, TensorParallelMatchesOneProcess) { expectAllOk(runWorkers("families_qk_norm_tp", {.ranks = 2})); }

namespace {

// arg: "DIR|FILE": DIR's model continues a prompt greedily; FILE gets the prompt, tokens, logits.
TESSERA_WORKER(families_generate_dump) {
  auto ctx = initWorker(w);
  const auto bar = w.arg.find('|');
  const auto source = hf::openModel(w.arg.substr(0, bar));
  auto m = hf::loadWholeModel(source, ctx.world, at::kCPU);
  const auto prompt = at::tensor({3, 17, 42, 5}, at::kLong).view({1, 4});
  models::GenerateOptions o;
  o.maxNewTokens = 6;
  o.keepLogits = true;
  const auto g = models::generate(*m, prompt, o);
  c10::Dict<std::string, at::Tensor> d;
  d.insert("prompt", prompt);
  d.insert("tokens", at::tensor(g.tokens[0], at::kLong));
  std::vector<at::Tensor> rows;
  for (const auto& l : g.logits) rows.push_back(l[0]);
  d.insert("logits", at::stack(rows));
  const auto bytes = torch::pickle_save(c10::IValue(d));
  std::ofstream(w.arg.substr(bar + 1), std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST(FamiliesGolden, GreedyGenerationMatchesTheReference) {
  const auto root = std::filesystem::temp_directory_path() / fmt::format("tessera-families-{}", ::getpid());
  const auto script = fmt::format("/usr/bin/python3 {}/tests/hf/hf_families.py", TESSERA_SOURCE_DIR);
  ASSERT_EQ(std::system(fmt::format("{} write {}", script, root.string()).c_str()), 0);
  std::string pairs;
  for (const char* family : {"qwen3", "mixtral", "qwen3_moe", "olmoe"}) {
    const std::string dir = (root / family).string(), file = (root / family).string() + ".pt";
    expectAllOk(runWorkers("families_generate_dump", {.ranks = 1, .arg = dir + "|" + file}));
    pairs += " " + dir + " " + file;
  }
  EXPECT_EQ(std::system(fmt::format("{} generate{}", script, pairs).c_str()), 0) << pairs;
  std::filesystem::remove_all(root);
}
