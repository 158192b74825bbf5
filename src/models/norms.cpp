// The Llama's norms: RmsNormImpl (llama.h) and the block's q/k RMSNorm (qk_norm.h).
#include <ATen/ATen.h>

#include "models/qk_norm.h"
#include "tessera/models/llama.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::models {

RmsNormImpl::RmsNormImpl(int64_t d, double eps_, CommPtr tp_, bool sp_) : eps(eps_), tp(std::move(tp_)), sp(sp_) {
  weight = register_parameter("weight", at::ones({d}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  const auto w = sp && tp ? tp::copyToRegion(weight, tp) : weight;
  if (fused) return nn::rmsNorm(x, w, eps);
  auto xf = x.to(at::kFloat);
  auto y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (y * w.to(at::kFloat)).to(x.scalar_type());
}

std::vector<NamedParam> RmsNormImpl::params(const std::string& prefix) {
  return {{prefix + "norm.weight", weight, true}};
}

std::vector<checkpoint::Piece> RmsNormImpl::pieces(const std::string& prefix) {
  return {checkpoint::whole(prefix + "norm.weight", weight.detach())};
}

nn::AddNormResult RmsNormImpl::addForward(const at::Tensor& x, const at::Tensor& branch) {
  if (fused) return nn::addRmsNorm(x, branch, sp && tp ? tp::copyToRegion(weight, tp) : weight, eps);
  auto s = branch.defined() ? x + branch : x;
  return {s, forward(s)};
}

namespace detail {

at::Tensor qkNorm(const at::Tensor& x, const at::Tensor& w, QkNorm kind, double eps, int64_t width,
                  const QkNormGroup& g) {
  const bool parallel = g.tp && g.tp->size() > 1;
  auto xf = x.to(at::kFloat);
  if (kind == QkNorm::PerHead) {
    const auto weight = parallel ? tp::copyToRegion(w, g.tp) : w;  // every rank's heads use it
    auto y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return (y * weight.to(at::kFloat)).to(x.scalar_type());
  }
  auto flat = xf.flatten(-2);  // [..., n·hd]
  auto squares = flat.pow(2).sum(-1, /*keepdim=*/true);
  if (parallel) {
    // fwd all-reduce / bwd all-reduce: every rank's normalised heads depend on every rank's sum.
    squares = tp::reduceFromRegion(tp::copyToRegion(squares, g.tp), g.tp);
    if (g.replicas > 1) squares = squares / static_cast<double>(g.replicas);
  }
  const auto weight = g.kvGroup && g.kvGroup->size() > 1 ? tp::copyToRegion(w, g.kvGroup) : w;
  auto y = flat * at::rsqrt(squares / static_cast<double>(width) + eps) * weight.to(at::kFloat);
  return y.to(x.scalar_type()).view(x.sizes());
}

}  // namespace detail
}  // namespace tessera::models
