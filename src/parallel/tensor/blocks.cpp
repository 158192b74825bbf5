#include "tessera/parallel/tensor/blocks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>

#include <fmt/ranges.h>

#include <mutex>

#include "tessera/common/attention.h"
#include "tessera/common/error.h"
#include "tessera/nn/fused_activations.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/nn/recompute.h"
#include "tessera/nn/rope.h"
#include "tessera/parallel/context/attention.h"
#include "tessera/parallel/context/chunks.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::tp {
namespace {

ParallelLinearOptions opts(const std::string& name, bool sp, bool initFromRng = true) {
  ParallelLinearOptions o;
  o.name = name;
  o.sequenceParallel = sp;
  o.initFromRng = initFromRng;
  return o;
}

// [q | k | v] rows, head-major → rank-major groups [q_r | k_r | v_r], so that chunking by
// tp gives each rank the q, k and v rows of its own heads.
at::Tensor groupByRank(const at::Tensor& full, int64_t tp) {
  auto shape = full.sizes().vec();
  shape[0] /= 3 * tp;
  std::vector<int64_t> split{3, tp};
  split.insert(split.end(), shape.begin(), shape.end());
  return full.reshape(split).transpose(0, 1).reshape(full.sizes());
}

// A generator of `device`'s kind, independent of the global one, seeded `seed`.
at::Generator maskGenerator(const at::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  at::Generator global = at::globalContext().defaultGenerator(device);
  at::Generator gen;
  {
    std::lock_guard<std::mutex> lock(global.mutex());
    gen = global.clone();
  }
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace

at::Tensor tpLayerNorm(torch::nn::LayerNorm& ln, const at::Tensor& x, const CommPtr& tp, bool sp, bool fused) {
  if (!sp && !fused) return ln->forward(x);
  const auto w = sp ? copyToRegion(ln->weight, tp) : ln->weight;
  const auto b = sp ? copyToRegion(ln->bias, tp) : ln->bias;
  if (fused) return nn::layerNorm(x, w, b, ln->options.eps());
  return at::layer_norm(x, ln->options.normalized_shape(), w, b, ln->options.eps());
}

nn::AddNormResult tpAddLayerNorm(torch::nn::LayerNorm& ln, const at::Tensor& x, const at::Tensor& branch,
                                 const CommPtr& tp, bool sp) {
  const auto w = sp ? copyToRegion(ln->weight, tp) : ln->weight;
  const auto b = sp ? copyToRegion(ln->bias, tp) : ln->bias;
  return nn::addLayerNorm(x, branch, w, b, ln->options.eps());
}

uint64_t blockDropoutSeed(uint64_t seed, int64_t call) {
  return seed + static_cast<uint64_t>(call) * 0x9E3779B97F4A7C15ull;
}

ParallelMlpImpl::ParallelMlpImpl(CommPtr tp, int64_t d, bool sp, const std::string& name, int64_t ffn) {
  if (ffn == 0) ffn = 4 * d;
  fc1 = register_module("fc1", ColumnParallelLinear(tp, d, ffn, opts(name + ".fc1", sp)));
  fc2 = register_module("fc2", RowParallelLinear(tp, ffn, d, opts(name + ".fc2", sp)));
}

at::Tensor ParallelMlpImpl::forward(const at::Tensor& x) {
  if (fusedActivation && fc1->bias.defined()) {
    return fc2->forward(nn::biasGelu(columnParallelLinear(x, fc1->weight, {}, fc1->tp, fc1->opts), fc1->bias));
  }
  auto h = fc1->forward(x);
  const nn::Fn gelu = [](const at::Tensor& t) { return at::gelu(t); };
  return fc2->forward(recomputeActivation ? nn::recompute(gelu, h) : gelu(h));
}

ParallelAttentionImpl::ParallelAttentionImpl(CommPtr tp, int64_t d, int64_t heads, bool sp, const std::string& name_)
    : name(name_) {
  TESSERA_CHECK(tp, "tp block '{}': no tensor-parallel communicator given", name);
  TESSERA_CHECK(heads > 0 && d % heads == 0, "tp block '{}': d = {} is not divisible by heads = {}", name, d, heads);
  TESSERA_CHECK(heads % tp->size() == 0, "tp block '{}': heads = {} is not divisible by the tensor-parallel size {}",
                name, heads, tp->size());
  localHeads = heads / tp->size();
  headDim = d / heads;
  torch::nn::Linear full(d, 3 * d);  // the unsharded qkv's draw
  qkv = register_module("qkv", ColumnParallelLinear(tp, d, 3 * d, opts(name + ".qkv", sp, false)));
  qkv->loadFull(groupByRank(full->weight, tp->size()), groupByRank(full->bias, tp->size()));
  proj = register_module("proj", RowParallelLinear(tp, d, d, opts(name + ".proj", sp)));
}

void ParallelAttentionImpl::loadFull(const at::Tensor& qkvW, const at::Tensor& qkvB, const at::Tensor& projW,
                                     const at::Tensor& projB) {
  const int64_t n = qkv->tp->size();
  TESSERA_CHECK(qkvW.dim() == 2 && qkvW.size(0) == qkv->out && qkvB.dim() == 1 && qkvB.size(0) == qkv->out,
                "tp layer '{}': full qkv weight/bias have shapes [{}] / [{}], expected [{}, {}] / [{}]", qkv->opts.name,
                fmt::join(qkvW.sizes(), ", "), fmt::join(qkvB.sizes(), ", "), qkv->out, qkv->in, qkv->out);
  qkv->loadFull(groupByRank(qkvW, n), groupByRank(qkvB, n));
  proj->loadFull(projW, projB);
}

at::Tensor ParallelAttentionImpl::forward(const at::Tensor& x) {
  TESSERA_CHECK(x.defined() && x.dim() == 3,
                "tp block '{}': input must be 3-D [tokens, batch, d] ([tokens/tp, batch, d] with sequence parallel), "
                "got [{}]",
                name, x.defined() ? fmt::format("{}", fmt::join(x.sizes(), ", ")) : "undefined");
  auto h = qkv->forward(x);  // [S, B, 3·localHeads·hd] (all tokens, also with sequence parallel)
  const int64_t s = h.size(0), b = h.size(1);
  // Unbind q, k, v where they lie (dim 2), then permute each to [B, h, S, hd]: backward then
  // stacks their gradients straight into [S, B, 3, h, hd], the layout of h. (Permuting first and
  // unbinding dim 0 made backward stack into [3, B, h, S, hd] and copy that again into h's
  // layout: two strided copies per layer, 3.8 of a tp=2 step's 88 ms on an H200.) SDPA's output
  // follows q's stride order, [S, B, h, hd], so the reshape below is a view.
  auto rope = [&] {  // the rotary tables of these positions (global ones under context parallel)
    if (!context) return nn::ropeTables(s, headDim, ropeTheta, {}, x.device());
    const int n = context->size(), r = context->rank();
    const auto all = nn::ropeTables(s * n, headDim, ropeTheta, {}, x.device());
    return nn::RopeTables{cp::shard(all.cos, 0, n, r), cp::shard(all.sin, 0, n, r)};
  };
  if (ropeTheta > 0 && fusedRope) h = nn::ropeQkInPlace(h, 2 * localHeads, rope());  // q, k rotated in place
  auto parts = h.view({s, b, 3, localHeads, headDim}).unbind(2);  // 3 x [S, B, h, hd]
  if (ropeTheta > 0 && !fusedRope) {
    const auto tables = rope();
    parts[0] = nn::applyRope(parts[0], tables);
    parts[1] = nn::applyRope(parts[1], tables);
  }
  const nn::MultiFn core = [s, b, this](const std::vector<at::Tensor>& t) {
    if (context) return cp::attention(t[0], t[1], t[2], context).reshape({s, b, localHeads * headDim});
    auto bhsd = [](const at::Tensor& x) { return x.permute({1, 2, 0, 3}); };
    return causalSelfAttention(bhsd(t[0]), bhsd(t[1]), bhsd(t[2]))  // [B, h, S, hd]
        .permute({2, 0, 1, 3})
        .reshape({s, b, localHeads * headDim});
  };
  const std::vector<at::Tensor> qkvParts{parts[0], parts[1], parts[2]};
  return proj->forward(recomputeCore ? nn::recompute(core, qkvParts) : core(qkvParts));
}

ParallelBlockImpl::ParallelBlockImpl(CommPtr t, int64_t d, int64_t heads, bool sp, const std::string& name,
                                     BlockDropout drop, int64_t ffn)
    : tp(std::move(t)), sequenceParallel(sp), name(name), dropout(drop) {
  TESSERA_CHECK(dropout.p >= 0 && dropout.p < 1, "tp block '{}': dropout probability p = {} is not in [0, 1)", name,
                dropout.p);
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  attn = register_module("attn", ParallelAttention(tp, d, heads, sp, name + ".attn"));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  mlp = register_module("mlp", ParallelMlp(tp, d, sp, name + ".mlp", ffn));
}

at::Tensor ParallelBlockImpl::forward(const at::Tensor& x) {
  const bool masked = dropout.p > 0 && is_training();
  at::Generator gen;
  if (masked) gen = maskGenerator(x.device(), blockDropoutSeed(dropout.seed, dropoutCalls++));
  auto maybeDrop = [&](const at::Tensor& v) { return masked ? drop(v, gen) : v; };
  if (fusedNorms) {  // the residual adds inside the LayerNorms' ops (tpAddLayerNorm)
    auto [x1, a] = tpAddLayerNorm(ln1, x, {}, tp, sequenceParallel);  // x1: x, its gradient summed in ln1's backward
    auto [y, m] = tpAddLayerNorm(ln2, x1, maybeDrop(attn->forward(a)), tp, sequenceParallel);
    return y + maybeDrop(mlp->forward(m));
  }
  auto norm = [&](torch::nn::LayerNorm& ln, const at::Tensor& v) {
    return tpLayerNorm(ln, v, tp, sequenceParallel, false);
  };
  auto y = x + maybeDrop(attn->forward(norm(ln1, x)));
  return y + maybeDrop(mlp->forward(norm(ln2, y)));
}

void ParallelBlockImpl::setFusedKernels(bool on) {
  fusedNorms = on;
  attn->fusedRope = on;
  mlp->fusedActivation = on;
}

at::Tensor ParallelBlockImpl::drop(const at::Tensor& v, at::Generator& gen) const {
  auto full = v.sizes().vec();
  if (sequenceParallel) full[0] *= tp->size();
  auto mask = at::empty(full, v.options()).bernoulli_(1 - dropout.p, gen).div_(1 - dropout.p);
  if (sequenceParallel) mask = mask.narrow(0, tp->rank() * v.size(0), v.size(0)).clone();
  return v * mask;
}

void ParallelBlockImpl::loadFull(const torch::OrderedDict<std::string, at::Tensor>& full, const std::string& prefix) {
  auto get = [&](const char* n) {
    const auto* t = full.find(prefix + n);
    TESSERA_CHECK(t, "tp block '{}': loadFull: no parameter '{}{}' in the unsharded parameters", name, prefix, n);
    return *t;
  };
  {
    at::NoGradGuard g;
    ln1->weight.copy_(get("ln1.weight"));
    ln1->bias.copy_(get("ln1.bias"));
    ln2->weight.copy_(get("ln2.weight"));
    ln2->bias.copy_(get("ln2.bias"));
  }
  attn->loadFull(get("qkv.weight"), get("qkv.bias"), get("proj.weight"), get("proj.bias"));
  mlp->fc1->loadFull(get("fc1.weight"), get("fc1.bias"));
  mlp->fc2->loadFull(get("fc2.weight"), get("fc2.bias"));
}

}  // namespace tessera::tp
