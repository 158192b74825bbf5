#include "tessera/parallel/grad_norm.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <map>

namespace tessera {

namespace {

// Σ ‖t‖² over `ts` (fp32 accumulation) as a 1-element fp32 tensor on `device`. LibTorch 2.x: one
// multi-tensor norm kernel for the float32 pieces (instead of a square and a sum per piece).
at::Tensor sumOfSquares(const std::vector<at::Tensor>& ts, at::Device device) {
  auto sq = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  std::vector<at::Tensor> f32;
  for (const auto& t : ts) {
    if (t.scalar_type() == at::kFloat) {
      f32.push_back(t);
    } else {
      sq.add_(at::norm(t.to(at::kFloat)).pow(2));
    }
  }
#if TORCH_VERSION_MAJOR >= 2
  if (!f32.empty()) sq.add_(at::stack(at::_foreach_norm(f32, 2)).pow(2).sum());
#else
  for (const auto& t : f32) sq.add_(at::norm(t).pow(2));
#endif
  return sq;
}

}  // namespace

GradNormClip globalGradNorm(const std::vector<GradPiece>& pieces, const std::vector<CommPtr>& sumOver, double maxNorm,
                            at::Device device) {
  at::NoGradGuard ng;
  std::map<double, std::vector<at::Tensor>> byWeight;
  for (const auto& p : pieces) {
    if (!p.grad.defined() || p.grad.numel() == 0) continue;
    byWeight[p.weight].push_back(p.grad);
  }
  auto sq = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& [w, ts] : byWeight) sq.add_(sumOfSquares(ts, device).mul(w));
  for (const auto& g : sumOver) {
    if (g && g->size() > 1) g->allReduce(sq, ReduceOp::Sum)->wait();
  }
  auto norm = sq.sqrt();
  auto coef = maxNorm > 0 ? (maxNorm / (norm + 1e-6)).clamp_max(1.0) : at::ones_like(norm);
  return {norm, coef};
}

double clipGlobalGradNorm(const std::vector<GradPiece>& pieces, const std::vector<CommPtr>& sumOver, double maxNorm,
                          at::Device device) {
  at::NoGradGuard ng;
  std::vector<at::Tensor> grads;
  for (const auto& p : pieces) {
    if (p.grad.defined() && p.grad.numel() > 0) grads.push_back(p.grad);
  }
  const auto [norm, coefTensor] = globalGradNorm(pieces, sumOver, maxNorm, device);
  if (maxNorm > 0 && !grads.empty()) {
    // Scaled by min(1, c) on the device: no host round trip before the optimizer's kernels.
    const auto c = coefTensor.reshape({});  // 0-dim, as _foreach_mul_ wants
#if TORCH_VERSION_MAJOR >= 2
    at::_foreach_mul_(grads, c);
#else
    for (auto& g : grads) g.mul_(c);
#endif
  }
  return norm.item<double>();
}

}  // namespace tessera
