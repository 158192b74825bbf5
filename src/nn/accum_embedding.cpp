// Embedding with its gradient summed into .grad row by row (contract in accum_embedding.h).
#include "tessera/nn/accum_embedding.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/nn/grad_sink.h"
#include "tessera/nn/stale_grads.h"
#include "nn/param_registry.h"

namespace tessera::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

detail::ParamRegistry<RowGradSink>& rowSinks() {
  static detail::ParamRegistry<RowGradSink> r;
  return r;
}

RowGradSink sinkFor(const at::Tensor& weight) { return rowSinks().get(weight); }

// weight.grad[ids] += rows, or the rows to the weight's sink when it takes them.
void sumRows(const at::Tensor& weight, const at::Tensor& ids, const at::Tensor& gy) {
  const auto flatIds = ids.reshape({-1}).to(at::kLong);  // int32 ids: not indices in 1.13
  const auto rows = gy.reshape({-1, weight.size(1)});
  if (auto sink = sinkFor(weight); sink && sink(flatIds, rows)) return;
  // Declined (or no sink): summed here, which needs what checkAccumulatable checks (an untracked
  // lookup with a sink skipped it: FSDP's bf16 tables, whose sink takes every row).
  checkAccumulatable("nn::embeddingAccumulateGrad", "weight", weight);
  if (auto s = gradSinkOf(weight); s.defined()) {  // grad_sink.h: summed into the sink's tensor
    s.index_put_({flatIds}, rows.to(at::kFloat), /*accumulate=*/true);
    return;
  }
  zeroIfStale(weight);  // stale_grads.h: only the rows of `ids` are written below
  auto& g = weight.mutable_grad();
  if (!g.defined()) g = at::zeros_like(weight, at::MemoryFormat::Contiguous);
  g.index_put_({flatIds}, rows.to(at::kFloat), /*accumulate=*/true);
}

struct AccumEmbedding : torch::autograd::Function<AccumEmbedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids, const at::Tensor& weight) {
    ctx->save_for_backward({ids, weight});
    return at::embedding(weight, ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    sumRows(saved[1], saved[0], grads[0]);
    return {at::Tensor(), at::Tensor()};
  }
};

struct WeightHolder : torch::CustomClassHolder {
  explicit WeightHolder(at::Tensor w) : weight(std::move(w)) {}
  at::Tensor weight;
};

// The untracked lookup: the weight travels beside autograd (no edge to its AccumulateGrad node);
// `anchor`, a fresh empty leaf, is the input that makes autograd record the node.
struct UntrackedEmbedding : torch::autograd::Function<UntrackedEmbedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids, const at::Tensor& /*anchor*/,
                            c10::intrusive_ptr<WeightHolder> w) {
    ctx->save_for_backward({ids});
    ctx->saved_data["weight"] = c10::IValue::make_capsule(w);
    return at::embedding(w->weight.detach(), ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto w = c10::static_intrusive_pointer_cast<WeightHolder>(ctx->saved_data["weight"].toCapsule());
    sumRows(w->weight, ctx->get_saved_variables()[0], grads[0]);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void setRowGradSink(const at::Tensor& weight, RowGradSink sink) { rowSinks().set(weight, std::move(sink)); }

bool hasRowGradSink(const at::Tensor& weight) { return static_cast<bool>(sinkFor(weight)); }

at::Tensor embeddingAccumulateGrad(const at::Tensor& ids, const at::Tensor& weight, bool untracked) {
  TESSERA_CHECK(ids.defined() && weight.defined() && weight.dim() == 2 &&
                    (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
                "nn::embeddingAccumulateGrad: needs integer ids (int64 or int32) and weight [vocab, dim]; got ids {} {}, "
                "weight {}",
                ids.defined() ? c10::str(ids.sizes()) : "undefined", ids.defined() ? dtypeName(ids.scalar_type()) : "",
                weight.defined() ? c10::str(weight.sizes()) : "undefined");
  if (!at::GradMode::is_enabled() || !weight.requires_grad()) return at::embedding(weight, ids);
  if (!untracked || !hasRowGradSink(weight)) checkAccumulatable("nn::embeddingAccumulateGrad", "weight", weight);
  if (!untracked) return AccumEmbedding::apply(ids, weight);
  TESSERA_CHECK(hasRowGradSink(weight),
                "nn::embeddingAccumulateGrad: an untracked lookup of weight {} needs a row-gradient sink on it "
                "(DdpOptions::gatherEmbeddingRows): without one its rows would race the weight's all-reduce",
                c10::str(weight.sizes()));
  auto anchor = at::empty({0}, weight.options()).requires_grad_(true);
  return UntrackedEmbedding::apply(ids, anchor, c10::make_intrusive<WeightHolder>(weight));
}

}  // namespace tessera::nn
