// Vocab-parallel embedding and cross-entropy (contracts in vocab.h).
#include "tessera/parallel/tensor/vocab.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include "tessera/common/error.h"
#include "kernels/cross_entropy.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::tp {

namespace {

std::string shapeStr(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string dtypeStr(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

// On CPU only (a host sync on CUDA): every id in [0, vocab).
void checkIdRange(const char* what, const at::Tensor& ids, int64_t vocab) {
  if (!ids.device().is_cpu() || ids.numel() == 0) return;
  int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  TESSERA_CHECK(lo >= 0 && hi < vocab, "{}: id out of range: ids span [{}, {}] but the vocab size is {}",
                what, lo, hi, vocab);
}

// fwd: see vocabParallelCrossEntropy. Inputs are validated by the caller. Every pass over the
// [N, V/tp] shard counts (1 GB of float32 per pass at the anchors' sizes), so: the row max is taken
// on the logits as given (exact for bf16/fp16), the shift promotes them to float32 in the same
// pass (no separate float32 copy), exp runs in place, and the softmax is never normalised in
// forward: backward scales exp(shifted) by g / (N · sumExp) row by row in the one pass it needs
// anyway, then subtracts g / N at the targets.
struct VocabParallelCE : public torch::autograd::Function<VocabParallelCE> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logitsShard,
                            const at::Tensor& targets, const CommPtr& tp) {
    const int64_t n = logitsShard.size(0), width = logitsShard.size(1);
    const int64_t start = static_cast<int64_t>(tp->rank()) * width;
    const bool many = tp->size() > 1;

    // Numerical stability: subtract the global row max (float32 from here on).
    at::Tensor rowMax = std::get<0>(logitsShard.max(1)).to(at::kFloat).contiguous();
    if (many) tp->allReduce(rowMax, ReduceOp::Max)->wait();
    at::Tensor shifted = at::sub(logitsShard, rowMax.unsqueeze(1));  // a fresh float32 tensor
    if (shifted.scalar_type() != at::kFloat) shifted = shifted.to(at::kFloat);  // float64 logits: float32, as ever

    // Target logit (0 where another rank owns the target) and the sum of exp, summed in one go.
    at::Tensor outside = (targets < start).logical_or(targets >= start + width);
    at::Tensor local = (targets - start).masked_fill(outside, 0);
    at::Tensor stats = at::empty({2, n}, shifted.options());
    stats[0].copy_(shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0));
    at::Tensor expd = shifted.exp_();  // in place: shifted is ours
    stats[1].copy_(expd.sum(1));
    if (many) tp->allReduce(stats, ReduceOp::Sum)->wait();
    at::Tensor targetLogit = stats[0], sumExp = stats[1];

    at::Tensor loss = (sumExp.log() - targetLogit).mean();
    ctx->save_for_backward({expd, sumExp, local, outside});
    ctx->saved_data["n"] = n;
    ctx->saved_data["dtype"] = logitsShard.scalar_type();
    return loss;
  }

  // bwd: local. d(mean loss)/d(logit j of row i) = g (softmax_ij − [j == target_i]) / N, with
  // softmax_ij = expd_ij / sumExp_i.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor expd = saved[0], sumExp = saved[1], local = saved[2], outside = saved[3];
    const int64_t n = ctx->saved_data["n"].toInt();
    const auto dtype = ctx->saved_data["dtype"].toScalarType();
    const at::Tensor gOverN = grads[0].to(expd.scalar_type()) / static_cast<double>(n);  // a scalar
    at::Tensor grad = expd * (gOverN / sumExp).unsqueeze(1);  // fresh: the saved expd stays intact
    grad.scatter_add_(1, local.unsqueeze(1), outside.logical_not().to(grad.scalar_type()).unsqueeze(1) * -gOverN);
    return {grad.to(dtype), at::Tensor(), at::Tensor()};
  }
};

// fwd: see vocabParallelCrossEntropy (fused). The kernels give this shard's (max, sum of exp
// relative to it, target logit) per row; the sums of exp are rescaled to the global max before
// the sum over tp: S = Σ_r s_r · exp(m_r − M). loss = mean(log S + M − target logit).
struct FusedVocabParallelCE : public torch::autograd::Function<FusedVocabParallelCE> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logitsShard,
                            const at::Tensor& targets, const CommPtr& tp, bool gradInLogits) {
    const int64_t start = static_cast<int64_t>(tp->rank()) * logitsShard.size(1);
    const bool many = tp->size() > 1;
    const at::Tensor part = kernels::crossEntropyPartials(logitsShard, targets, start);  // [3, N]
    at::Tensor rowMax = part[0].clone();
    if (many) tp->allReduce(rowMax, ReduceOp::Max)->wait();
    at::Tensor stats = at::empty({2, logitsShard.size(0)}, part.options());
    stats[0].copy_(part[2]);
    stats[1].copy_(many ? part[1] * (part[0] - rowMax).exp_() : part[1]);
    if (many) tp->allReduce(stats, ReduceOp::Sum)->wait();
    at::Tensor sumExp = stats[1].contiguous();
    at::Tensor loss = (sumExp.log() + rowMax - stats[0]).mean();
    ctx->save_for_backward({logitsShard, targets, rowMax, sumExp});
    ctx->saved_data["start"] = start;
    ctx->saved_data["in_place"] = gradInLogits;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t n = saved[0].size(0);
    const at::Tensor gOverN = grads[0].to(at::kFloat) / static_cast<double>(n);  // stays on the device
    const int64_t start = ctx->saved_data["start"].toInt();
    at::Tensor logits = saved[0];
    // In place: the saved logits' version moves on, so a second backward through this loss fails in
    // autograd's saved-variable check (retain_graph) instead of reading gradients as logits.
    at::Tensor grad = ctx->saved_data["in_place"].toBool()
                          ? kernels::crossEntropyGradInPlace(logits, saved[1], start, saved[2], saved[3], gOverN)
                          : kernels::crossEntropyGrad(logits, saved[1], start, saved[2], saved[3], gOverN);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

VocabRange vocabRange(int64_t vocab, int rank, int size, const std::string& layer) {
  TESSERA_CHECK(vocab > 0, "{}: vocab size must be positive, got {}", layer, vocab);
  TESSERA_CHECK(size > 0 && rank >= 0 && rank < size, "{}: rank {} is not in a group of {}", layer, rank, size);
  TESSERA_CHECK(vocab % size == 0,
                "{}: vocab size {} is not divisible by the tensor-parallel size {} (pad the vocab to a "
                "multiple of {})",
                layer, vocab, size, size);
  int64_t per = vocab / size;
  return {rank * per, (rank + 1) * per};
}

// ---------------------------------------------------------------- VocabParallelEmbedding

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, CommPtr tp, uint64_t seed,
                                                       at::TensorOptions options)
    : tp_(std::move(tp)) {
  TESSERA_CHECK(tp_ != nullptr, "VocabParallelEmbedding: no tensor-parallel group given");
  TESSERA_CHECK(dim > 0, "VocabParallelEmbedding: embedding dim must be positive, got {}", dim);
  VocabRange r = vocabRange(vocab, tp_->rank(), tp_->size(), "VocabParallelEmbedding");
  // Draw the full weight (identical on every rank), keep our rows.
  at::Tensor full = fullInitWeight(vocab, dim, seed);
  at::TensorOptions o = options.has_dtype() ? options : options.dtype(at::kFloat);
  setup(vocab, dim, full.slice(0, r.start, r.end).to(o, /*non_blocking=*/false, /*copy=*/true));
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const at::Tensor& fullWeight, CommPtr tp)
    : tp_(std::move(tp)) {
  TESSERA_CHECK(tp_ != nullptr, "VocabParallelEmbedding: no tensor-parallel group given");
  TESSERA_CHECK(fullWeight.defined() && fullWeight.dim() == 2,
                "VocabParallelEmbedding: the full weight must be [vocab, dim], got {}",
                fullWeight.defined() ? shapeStr(fullWeight) : "an undefined tensor");
  VocabRange r = vocabRange(fullWeight.size(0), tp_->rank(), tp_->size(), "VocabParallelEmbedding");
  setup(fullWeight.size(0), fullWeight.size(1), fullWeight.detach().slice(0, r.start, r.end).clone());
}

void VocabParallelEmbeddingImpl::setup(int64_t vocab, int64_t dim, const at::Tensor& shard) {
  vocab_ = vocab;
  dim_ = dim;
  range_ = vocabRange(vocab, tp_->rank(), tp_->size(), "VocabParallelEmbedding");
  weight = register_parameter("weight", shard.contiguous());
}

at::Tensor VocabParallelEmbeddingImpl::fullInitWeight(int64_t vocab, int64_t dim, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::empty({vocab, dim}, at::kFloat).normal_(0.0, 1.0, gen);
}

void VocabParallelEmbeddingImpl::loadFull(const at::Tensor& fullWeight) {
  TESSERA_CHECK(fullWeight.defined() && fullWeight.dim() == 2 && fullWeight.size(0) == vocab_ &&
                    fullWeight.size(1) == dim_,
                "VocabParallelEmbedding::loadFull: the full weight must be [{}, {}], got {}", vocab_, dim_,
                fullWeight.defined() ? shapeStr(fullWeight) : "an undefined tensor");
  torch::NoGradGuard noGrad;
  weight.copy_(fullWeight.slice(0, range_.start, range_.end));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  return vocabParallelEmbedding(ids, weight, tp_, vocab_, accumulateGrad, untracked);
}

at::Tensor vocabParallelEmbedding(const at::Tensor& ids, const at::Tensor& weight, const CommPtr& tp,
                                  int64_t vocab, bool accumulateGrad, bool untracked) {
  TESSERA_CHECK(tp != nullptr, "VocabParallelEmbedding: no tensor-parallel group given");
  const VocabRange range = vocabRange(vocab, tp->rank(), tp->size(), "VocabParallelEmbedding");
  TESSERA_CHECK(weight.defined() && weight.dim() == 2 && weight.size(0) == range.size(),
                "VocabParallelEmbedding: the weight shard must be [vocab/tp = {}, dim], got {}", range.size(),
                weight.defined() ? shapeStr(weight) : "an undefined tensor");
  TESSERA_CHECK(ids.defined() && (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
                "VocabParallelEmbedding: ids must be int64 or int32, got {}",
                ids.defined() ? dtypeStr(ids) : "an undefined tensor");
  TESSERA_CHECK(ids.device() == weight.device(), "VocabParallelEmbedding: ids are on {} but the weight is on {}",
                ids.device().str(), weight.device().str());
  checkIdRange("VocabParallelEmbedding", ids, vocab);
  auto lookup = [&](const at::Tensor& rows) {
    return accumulateGrad ? nn::embeddingAccumulateGrad(rows, weight, untracked) : at::embedding(weight, rows);
  };
  if (tp->size() == 1) return lookup(ids);
  at::Tensor outside = (ids < range.start).logical_or(ids >= range.end);
  at::Tensor local = (ids - range.start).masked_fill(outside, 0);
  at::Tensor partial = lookup(local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduceFromRegion(partial, tp);
}

// ---------------------------------------------------------------- cross-entropy

at::Tensor vocabParallelCrossEntropy(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp,
                                     int64_t vocab, bool fused, bool gradInLogits) {
  const char* op = "vocabParallelCrossEntropy";
  TESSERA_CHECK(tp != nullptr, "{}: no tensor-parallel group given", op);
  TESSERA_CHECK(logitsShard.defined() && logitsShard.dim() == 2,
                "{}: logits shard must be [N, V/tp] (2-D), got {}", op,
                logitsShard.defined() ? shapeStr(logitsShard) : "an undefined tensor");
  TESSERA_CHECK(at::isFloatingType(logitsShard.scalar_type()), "{}: logits must be floating point, got {}", op,
                dtypeStr(logitsShard));
  TESSERA_CHECK(targets.defined() && targets.scalar_type() == at::kLong,
                "{}: targets must be int64 class indices, got {}", op,
                targets.defined() ? dtypeStr(targets) : "an undefined tensor");
  const int64_t n = logitsShard.size(0), width = logitsShard.size(1);
  TESSERA_CHECK(targets.dim() == 1 && targets.size(0) == n,
                "{}: targets must be [N] = [{}] to match logits shard {}, got {}", op, n, shapeStr(logitsShard),
                shapeStr(targets));
  TESSERA_CHECK(n > 0, "{}: no rows (N = 0)", op);
  TESSERA_CHECK(width > 0, "{}: logits shard {} has no columns", op, shapeStr(logitsShard));
  TESSERA_CHECK(targets.device() == logitsShard.device(), "{}: targets are on {} but the logits on {}", op,
                targets.device().str(), logitsShard.device().str());
  const int64_t full = width * tp->size();
  if (vocab > 0)
    TESSERA_CHECK(full == vocab,
                  "{}: logits shard width {} × tensor-parallel size {} = {} does not match the vocab size {}",
                  op, width, tp->size(), full, vocab);
  checkIdRange(op, targets, full);
  TESSERA_CHECK(!gradInLogits || fused, "{}: the gradient written over the logits needs the fused kernels", op);
  if (fused) {  // rows padded for aligned GEMMs are read (and written) where they are
    const auto logits = kernels::rowsContiguous(logitsShard) ? logitsShard : logitsShard.contiguous();
    return FusedVocabParallelCE::apply(logits, targets.contiguous(), tp, gradInLogits);
  }
  return VocabParallelCE::apply(logitsShard, targets, tp);
}

}  // namespace tessera::tp
