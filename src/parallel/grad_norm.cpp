#include "parallel/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>

namespace tessera {

double clipGlobalGradNorm(const std::vector<GradPiece>& pieces, const std::vector<CommPtr>& sumOver, double maxNorm,
                          at::Device device) {
  at::NoGradGuard ng;
  auto sq = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& p : pieces) {
    if (!p.grad.defined() || p.grad.numel() == 0) continue;
    sq.add_(p.grad.to(at::kFloat).pow(2).sum().mul(p.weight));
  }
  for (const auto& g : sumOver) {
    if (g && g->size() > 1) g->allReduce(sq, ReduceOp::Sum)->wait();
  }
  const double norm = std::sqrt(sq.item<double>());
  const double coef = maxNorm / (norm + 1e-6);
  if (maxNorm > 0 && coef < 1) {
    for (const auto& p : pieces) {
      if (p.grad.defined()) p.grad.mul_(coef);
    }
  }
  return norm;
}

}  // namespace tessera
