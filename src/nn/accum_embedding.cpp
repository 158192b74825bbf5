// Embedding with its gradient summed into .grad row by row (contract in accum_embedding.h).
#include "nn/accum_embedding.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/error.h"
#include "comm/types.h"
#include "nn/accum_linear.h"
#include "nn/stale_grads.h"

namespace tessera::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AccumEmbedding : torch::autograd::Function<AccumEmbedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids, const at::Tensor& weight) {
    ctx->save_for_backward({ids, weight});
    return at::embedding(weight, ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor ids = saved[0], weight = saved[1];
    auto gy = grads[0].reshape({-1, weight.size(1)}).to(at::kFloat);
    zeroIfStale(weight);  // stale_grads.h: only the rows of `ids` are written below
    auto& g = weight.mutable_grad();
    if (!g.defined()) g = at::zeros_like(weight, at::MemoryFormat::Contiguous);
    g.index_put_({ids.reshape({-1}).to(at::kLong)}, gy, /*accumulate=*/true);  // int32 ids: not indices in 1.13
    return {at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor embeddingAccumulateGrad(const at::Tensor& ids, const at::Tensor& weight) {
  TESSERA_CHECK(ids.defined() && weight.defined() && weight.dim() == 2 &&
                    (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt),
                "nn::embeddingAccumulateGrad: needs integer ids (int64 or int32) and weight [vocab, dim]; got ids {} {}, "
                "weight {}",
                ids.defined() ? c10::str(ids.sizes()) : "undefined", ids.defined() ? dtypeName(ids.scalar_type()) : "",
                weight.defined() ? c10::str(weight.sizes()) : "undefined");
  if (!at::GradMode::is_enabled() || !weight.requires_grad()) return at::embedding(weight, ids);
  checkAccumulatable("nn::embeddingAccumulateGrad", "weight", weight);
  return AccumEmbedding::apply(ids, weight);
}

}  // namespace tessera::nn
