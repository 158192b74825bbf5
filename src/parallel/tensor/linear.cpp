#include "tessera/parallel/tensor/linear.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/linear.h>

#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/parallel/tensor/mappings.h"
#include "parallel/tensor/row_linear.h"
#include "tessera/parallel/tensor/vocab.h"

namespace tessera::tp {
namespace {

void checkSplit(const CommPtr& tp, const std::string& layer, const char* what, int64_t n) {
  TESSERA_CHECK(tp, "tp layer '{}': no tensor-parallel communicator given", layer);
  TESSERA_CHECK(n % tp->size() == 0, "tp layer '{}': {} = {} is not divisible by the tensor-parallel size {}", layer,
                what, n, tp->size());
}

void checkFull(const std::string& layer, const at::Tensor& w, int64_t out, int64_t in, const at::Tensor& b,
               bool hasBias) {
  TESSERA_CHECK(w.dim() == 2 && w.size(0) == out && w.size(1) == in,
                "tp layer '{}': full weight has shape [{}], expected [{}, {}]", layer, fmt::join(w.sizes(), ", "), out,
                in);
  TESSERA_CHECK(!hasBias || (b.defined() && b.dim() == 1 && b.size(0) == out),
                "tp layer '{}': full bias must have shape [{}]", layer, out);
}

// The unsharded layer's initial weights, drawn from the current RNG state.
torch::nn::Linear fullInit(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(CommPtr t, int64_t i, int64_t o, ParallelLinearOptions opt)
    : in(i), out(o), opts(std::move(opt)), tp(std::move(t)) {
  checkSplit(tp, opts.name, "output features", out);
  weight = register_parameter("weight", at::zeros({out / tp->size(), in}));
  if (opts.bias) bias = register_parameter("bias", at::zeros({out / tp->size()}));
  if (!opts.initFromRng) return;
  auto full = fullInit(in, out, opts.bias);
  loadFull(full->weight, opts.bias ? full->bias : at::Tensor());
}

void ColumnParallelLinearImpl::loadFull(const at::Tensor& w, const at::Tensor& b) {
  checkFull(opts.name, w, out, in, b, opts.bias);
  at::NoGradGuard g;
  weight.copy_(w.chunk(tp->size(), 0)[tp->rank()]);
  if (opts.bias) bias.copy_(b.chunk(tp->size(), 0)[tp->rank()]);
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  return columnParallelLinear(x, weight, bias, tp, opts);
}

RowParallelLinearImpl::RowParallelLinearImpl(CommPtr t, int64_t i, int64_t o, ParallelLinearOptions opt)
    : in(i), out(o), opts(std::move(opt)), tp(std::move(t)) {
  checkSplit(tp, opts.name, "input features", in);
  weight = register_parameter("weight", at::zeros({out, in / tp->size()}));
  if (opts.bias) bias = register_parameter("bias", at::zeros({out}));
  if (!opts.initFromRng) return;
  auto full = fullInit(in, out, opts.bias);
  loadFull(full->weight, opts.bias ? full->bias : at::Tensor());
}

void RowParallelLinearImpl::loadFull(const at::Tensor& w, const at::Tensor& b) {
  checkFull(opts.name, w, out, in, b, opts.bias);
  at::NoGradGuard g;
  weight.copy_(w.chunk(tp->size(), 1)[tp->rank()]);
  if (opts.bias) bias.copy_(b);
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  return rowParallelLinear(x, weight, bias, tp, opts);
}

namespace {
// accumulateGradInGemm: the parameters must be float32 leaves with a usable .grad (checked here,
// before any communication, so every rank fails alike).
void checkAccumulating(const at::Tensor& weight, const at::Tensor& bias, const ParallelLinearOptions& opts) {
  if (!at::GradMode::is_enabled()) return;
  const auto op = fmt::format("tp layer '{}' (accumulateGradInGemm)", opts.name);
  if (weight.requires_grad()) nn::checkAccumulatable(op.c_str(), "weight", weight);
  if (bias.defined() && bias.requires_grad()) nn::checkAccumulatable(op.c_str(), "bias", bias);
}
}  // namespace

at::Tensor columnParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const CommPtr& tp, const ParallelLinearOptions& opts) {
  TESSERA_CHECK(tp, "tp layer '{}': no tensor-parallel communicator given", opts.name);
  TESSERA_CHECK(weight.defined() && weight.dim() == 2, "tp layer '{}' (column-parallel): weight must be 2-D [out/tp, in]",
                opts.name);
  const int64_t in = weight.size(1);
  TESSERA_CHECK(x.dim() >= 1 && x.size(-1) == in, "tp layer '{}' (column-parallel): input has {} features, expects {}",
                opts.name, x.dim() ? x.size(-1) : 0, in);
  TESSERA_CHECK(!opts.sequenceParallel || x.dim() >= 2,
                "tp layer '{}' (column-parallel, sequence parallel): input must be [tokens/tp, ..., in] (at least "
                "2-D), got [{}]",
                opts.name, fmt::join(x.sizes(), ", "));
  const bool acc = opts.accumulateGradInGemm;
  if (acc) checkAccumulating(weight, bias, opts);
  TESSERA_CHECK(opts.fp8 == fp8::Recipe::Off || opts.overlapGradReduce,
                "tp layer '{}' (column-parallel): fp8 {} needs overlapGradReduce (the op that quantizes its GEMMs)",
                opts.name, fp8::name(opts.fp8));
  at::Tensor y;
  if (opts.fp8 != fp8::Recipe::Off) {
    y = columnLinearAsyncGrad(x, weight, bias, tp, opts.sequenceParallel, opts.overlap, opts.backwardTrace, acc,
                              opts.fp8);
  } else if (tp->size() == 1 && acc) {
    y = nn::linearAccumulateGrad(x, weight, bias);
  } else if (opts.overlapGradReduce) {
    y = columnLinearAsyncGrad(x, weight, bias, tp, opts.sequenceParallel, opts.overlap, opts.backwardTrace, acc);
  } else {
    auto in = opts.sequenceParallel ? gatherSeq(x, tp) : copyToRegion(x, tp);
    y = acc ? nn::linearAccumulateGrad(in, weight, bias) : at::linear(in, weight, bias);
  }
  return opts.gatherOutput ? gatherLastDim(y, tp) : y;
}

at::Tensor rowParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const CommPtr& tp, const ParallelLinearOptions& opts) {
  TESSERA_CHECK(tp, "tp layer '{}': no tensor-parallel communicator given", opts.name);
  TESSERA_CHECK(weight.defined() && weight.dim() == 2, "tp layer '{}' (row-parallel): weight must be 2-D [out, in/tp]",
                opts.name);
  const int64_t local = weight.size(1), in = local * tp->size();
  TESSERA_CHECK(x.defined() && x.dim() >= 1, "tp layer '{}' (row-parallel): input must be [..., in/tp] (at least 1-D)",
                opts.name);
  // Split here: name the layer (not the mapping) when the full input's width is wrong.
  TESSERA_CHECK(opts.inputIsParallel || x.size(-1) == in,
                "tp layer '{}' (row-parallel, input not parallel): input has {} features, expects in = {} (split here "
                "over the tensor-parallel size {})",
                opts.name, x.size(-1), in, tp->size());
  TESSERA_CHECK(!opts.sequenceParallel || x.dim() >= 2,
                "tp layer '{}' (row-parallel, sequence parallel): input must be [tokens, ..., in/tp] (at least 2-D), "
                "got [{}]",
                opts.name, fmt::join(x.sizes(), ", "));
  auto input = opts.inputIsParallel ? x : splitLastDim(x, tp);
  TESSERA_CHECK(input.dim() >= 1 && input.size(-1) == local,
                "tp layer '{}' (row-parallel): input shard has {} features, expects in/tp = {}/{} = {}", opts.name,
                input.dim() ? input.size(-1) : 0, in, tp->size(), local);
  const bool acc = opts.accumulateGradInGemm;
  if (acc) checkAccumulating(weight, bias, opts);
  if (tp->size() == 1) {  // a group of one: no communication (FP8: the column op, a plain linear here)
    if (opts.fp8 != fp8::Recipe::Off)
      return columnLinearAsyncGrad(input, weight, bias, tp, false, opts.overlap, {}, acc, opts.fp8);
    return acc ? nn::linearAccumulateGrad(input, weight, bias) : at::linear(input, weight, bias);
  }
  TESSERA_CHECK(!opts.sequenceParallel || input.size(0) % tp->size() == 0,
                "tp layer '{}' (row-parallel, sequence parallel): {} tokens (dimension 0) are not divisible by the "
                "tensor-parallel size {}",
                opts.name, input.size(0), tp->size());
  return rowLinearReduce(castForCudaAutocast(input), weight, bias, tp, opts.sequenceParallel, opts.overlap, acc,
                         opts.fp8);
}

void setOverlap(torch::nn::Module& root, const LinearOverlap& overlap) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) c->opts.overlap = overlap;
    if (auto* r = dynamic_cast<RowParallelLinearImpl*>(m.get())) r->opts.overlap = overlap;
  }
}

void setFp8(torch::nn::Module& root, fp8::Recipe recipe) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) c->opts.fp8 = recipe;
    if (auto* r = dynamic_cast<RowParallelLinearImpl*>(m.get())) r->opts.fp8 = recipe;
  }
}

void setAccumulateGradInGemm(torch::nn::Module& root, bool on) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) c->opts.accumulateGradInGemm = on;
    if (auto* r = dynamic_cast<RowParallelLinearImpl*>(m.get())) r->opts.accumulateGradInGemm = on;
    if (auto* e = dynamic_cast<VocabParallelEmbeddingImpl*>(m.get())) e->accumulateGrad = on;
  }
}

}  // namespace tessera::tp
