#include "models/moe/router.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace tessera::models::moe_detail {

Routing route(const at::Tensor& x2d, const at::Tensor& router, const at::Tensor& bias, const MoeConfig& m,
              bool forceBalanced) {
  Routing r;
  r.logits = at::linear(x2d.to(at::kFloat), router.to(at::kFloat));
  r.scores = m.score == RouterScore::Softmax ? at::softmax(r.logits, -1) : at::sigmoid(r.logits);
  if (forceBalanced) {
    const auto idx = at::TensorOptions().dtype(at::kLong).device(x2d.device());
    r.chosen = (at::arange(x2d.size(0), idx).unsqueeze(1) * m.topK + at::arange(m.topK, idx).unsqueeze(0))
                   .remainder(m.experts)
                   .contiguous();
  } else {
    auto select = r.scores.detach();
    if (bias.defined()) select = select + bias.to(select.device(), at::kFloat);
    // A stable sort: equal scores keep expert order, so ties go to the lower expert on every rank.
    auto order = std::get<1>(at::sort(select, /*stable=*/true, /*dim=*/-1, /*descending=*/true));
    r.chosen = order.narrow(1, 0, m.topK).contiguous();
  }
  // A scatter-add, not at::bincount: CUDA's bincount reads the input's min and max on the host (two syncs a layer).
  auto flat = r.chosen.reshape(-1);
  r.counts = at::zeros({m.experts}, flat.options()).scatter_add_(0, flat, at::ones_like(flat));
  auto p = r.scores.gather(1, r.chosen);
  if (m.normTopK) p = p / (p.sum(-1, /*keepdim=*/true) + 1e-20);
  r.weights = m.routedScale == 1.0 ? p : p * m.routedScale;
  return r;
}

at::Tensor balanceLoss(const Routing& r, const MoeConfig& m) {
  const int64_t experts = m.experts;
  const int64_t n = r.scores.size(0);
  if (n == 0) return r.scores.sum();
  const auto counts = r.counts.to(at::kFloat);
  auto probs = r.scores;
  if (m.score == RouterScore::Sigmoid) probs = probs / probs.sum(-1, /*keepdim=*/true);  // per-token shares
  return static_cast<double>(experts) * ((counts / static_cast<double>(n)) * probs.mean(0)).sum();
}

at::Tensor zLoss(const Routing& r) { return at::logsumexp(r.logits, -1).pow(2).mean(); }

namespace {
struct AttachLoss : torch::autograd::Function<AttachLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y, const at::Tensor& loss) {
    ctx->saved_data["shape"] = loss.sizes().vec();
    ctx->saved_data["options"] = loss.scalar_type();
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto ones = at::ones(ctx->saved_data["shape"].toIntVector(),
                         g[0].options().dtype(ctx->saved_data["options"].toScalarType()));
    return {g[0], ones};
  }
};
}  // namespace

at::Tensor attachLoss(const at::Tensor& y, const at::Tensor& loss) { return AttachLoss::apply(y, loss); }

}  // namespace tessera::models::moe_detail
