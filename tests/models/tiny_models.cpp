// Tiny test models; see tiny_models.h for the contract.
#include "models/tiny_models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <limits>
#include <mutex>

namespace tessera::testing {
namespace {

NamedTensors toNamed(const torch::OrderedDict<std::string, torch::Tensor>& d) {
  NamedTensors out;
  out.reserve(d.size());
  for (const auto& item : d) out.emplace_back(item.key(), item.value());
  return out;
}

// One generator per (seed, rank): distinct streams, independent of torch's global generator.
at::Generator batchGenerator(uint64_t seed, int rank) {
  uint64_t mixed = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull + 1;
  return at::make_generator<at::CPUGeneratorImpl>(mixed);
}

}  // namespace

NamedTensors namedParameters(const torch::nn::Module& m) { return toNamed(m.named_parameters(true)); }
NamedTensors namedBuffers(const torch::nn::Module& m) { return toNamed(m.named_buffers(true)); }

// ---- TinyMlp

TinyMlpImpl::TinyMlpImpl(const TinyMlpOptions& o) : opts(o) {
  fc1 = register_module("fc1", torch::nn::Linear(o.in, o.hidden));
  fc2 = register_module("fc2", torch::nn::Linear(o.hidden, o.hidden));
  fc3 = register_module("fc3", torch::nn::Linear(o.hidden, o.out));
}

torch::Tensor TinyMlpImpl::forward(const torch::Tensor& x) {
  auto lin = [this](torch::nn::Linear& l, const torch::Tensor& v) {
    return linearFn ? linearFn(v, l->weight, l->bias) : l->forward(v);
  };
  auto h = torch::relu(lin(fc1, x));
  if (!skipFc2) h = torch::relu(lin(fc2, h));
  return lin(fc3, h);
}

TinyMlp makeTinyMlp(uint64_t seed, const TinyMlpOptions& o) {
  torch::manual_seed(seed);
  return TinyMlp(o);
}

MlpBatch mlpBatch(uint64_t seed, int rank, int64_t batch, const TinyMlpOptions& o, const torch::Device& device) {
  auto g = batchGenerator(seed, rank);
  auto x = torch::randn({batch, o.in}, g, torch::kFloat32);
  auto y = torch::randn({batch, o.out}, g, torch::kFloat32);
  return {x.to(device), y.to(device)};
}

MlpBatch concatMlpBatches(uint64_t seed, int worldSize, int64_t batch, const TinyMlpOptions& o,
                          const torch::Device& device) {
  std::vector<torch::Tensor> xs, ys;
  for (int r = 0; r < worldSize; ++r) {
    auto b = mlpBatch(seed, r, batch, o, device);
    xs.push_back(b.x);
    ys.push_back(b.y);
  }
  return {torch::cat(xs, 0), torch::cat(ys, 0)};
}

torch::Tensor mlpLoss(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::mse_loss(out, y);
}

// ---- TinyGpt

GptBlockImpl::GptBlockImpl(int64_t d, int64_t h, double p, uint64_t seed) : heads(h), dropout(p), dropoutSeed(seed) {
  TORCH_CHECK(d % h == 0, "GptBlock: d=", d, " is not a multiple of heads=", h);
  TORCH_CHECK(p >= 0 && p < 1, "GptBlock: dropout=", p, " is not in [0, 1)");
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
  proj = register_module("proj", torch::nn::Linear(d, d));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
  fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
  // [B, T, 3, H, hd] -> three [B, H, T, hd]
  auto parts = qkv->forward(ln1->forward(x)).view({b, t, 3, heads, hd}).unbind(2);
  auto q = parts[0].transpose(1, 2), k = parts[1].transpose(1, 2), v = parts[2].transpose(1, 2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  auto mask = torch::triu(torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())), 1);
  att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  auto a = torch::matmul(att, v).transpose(1, 2).reshape({b, t, d});
  at::Generator gen;
  if (dropout > 0 && is_training()) {
    const uint64_t seed = dropoutSeed + static_cast<uint64_t>(dropoutCalls++) * 0x9E3779B97F4A7C15ull;
    if (x.device().is_cpu()) {
      gen = at::detail::createCPUGenerator(seed);
    } else {
      at::Generator global = at::globalContext().defaultGenerator(x.device());
      std::lock_guard<std::mutex> lock(global.mutex());
      gen = global.clone();
      gen.set_current_seed(seed);
    }
  }
  auto drop = [&](const torch::Tensor& v) {  // v [B, T, d]; the mask is drawn [T, B, d]
    if (!gen.defined()) return v;
    auto mask = torch::empty({t, b, d}, v.options()).bernoulli_(1 - dropout, gen).div_(1 - dropout);
    return v * mask.transpose(0, 1);
  };
  auto y = x + drop(proj->forward(a));
  return y + drop(fc2->forward(torch::gelu(fc1->forward(ln2->forward(y)))));
}

TinyGptImpl::TinyGptImpl(const TinyGptOptions& o) : opts(o) {
  tok = register_module("tok", torch::nn::Embedding(o.vocab, o.d));
  pos = register_parameter("pos", torch::randn({o.seqLen, o.d}) * 0.02);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) blocks->push_back(GptBlock(o.d, o.heads));
  lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d})));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(o.d, o.vocab).bias(false)));
  // GPT-2 style: small normal weights for the embedding and the matrices, zero biases.
  torch::NoGradGuard ng;
  for (auto& p : named_parameters(true)) {
    const auto& name = p.key();
    if (name.find("ln") != std::string::npos || name == "pos") continue;
    if (p.value().dim() >= 2) p.value().normal_(0.0, 0.02);
    else p.value().zero_();
  }
}

torch::Tensor TinyGptImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= opts.seqLen, "TinyGpt: sequence ", t, " > seqLen ", opts.seqLen);
  auto x = tok->forward(tokens) + pos.slice(0, 0, t);
  for (const auto& blk : *blocks) x = blk->as<GptBlock>()->forward(x);
  return head->forward(lnf->forward(x));
}

TinyGpt makeTinyGpt(uint64_t seed, const TinyGptOptions& o) {
  torch::manual_seed(seed);
  return TinyGpt(o);
}

GptBatch gptBatch(uint64_t seed, int rank, int64_t batch, const TinyGptOptions& o, const torch::Device& device) {
  auto g = batchGenerator(seed, rank);
  auto tokens = torch::randint(0, o.vocab, {batch, o.seqLen}, g, torch::kLong);
  auto targets = torch::randint(0, o.vocab, {batch, o.seqLen}, g, torch::kLong);
  return {tokens.to(device), targets.to(device)};
}

GptBatch concatGptBatches(uint64_t seed, int worldSize, int64_t batch, const TinyGptOptions& o,
                          const torch::Device& device) {
  std::vector<torch::Tensor> ts, ys;
  for (int r = 0; r < worldSize; ++r) {
    auto b = gptBatch(seed, r, batch, o, device);
    ts.push_back(b.tokens);
    ys.push_back(b.targets);
  }
  return {torch::cat(ts, 0), torch::cat(ys, 0)};
}

torch::Tensor gptLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

}  // namespace tessera::testing
