#pragma once
// Global gradient-norm clipping for a model whose gradients are spread over a process mesh
// (Megatron's clip_grad_norm over tensor, pipeline and data-parallel shards).
// Each rank passes the gradient pieces it holds, each with a weight: 1 for a piece no other rank in
// the summed groups holds (a TP shard, a PP stage's parameter, an FSDP shard), 1/k for a piece held
// identically by k of them (a norm weight replicated over tp: 1/tp). The squared norm is Σ over the
// ranks of `sumOver`'s groups of Σ weight·‖piece‖², so every value of the model counts once.
// Replicas whose gradients are already identical (DDP's dp axis) are left out of `sumOver`.
// Collective over every group in `sumOver`, in that order (all ranks of each must call). Pieces are
// fp32 or lower; the sum is accumulated in fp32 on `device`. No pieces: contributes 0.
#include <ATen/core/Tensor.h>

#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

struct GradPiece {
  at::Tensor grad;      // a view into the gradient (scaled in place)
  double weight = 1.0;  // 1 / number of summed ranks holding the same values
};

// Returns the norm before clipping. When maxNorm > 0 and c = maxNorm / (norm + 1e-6) < 1, scales
// every piece in place by c, as torch::nn::utils::clip_grad_norm_ (×min(1, c) on the device; ×1
// leaves a value unchanged). On CUDA one host synchronisation: the norm, read after the scaling.
// Example:
//   std::vector<tessera::GradPiece> pieces;  // a DDP model: every rank holds the same gradients
//   for (const at::Tensor& p : model->parameters()) pieces.push_back({p.grad(), 1.0});
//   double norm = tessera::clipGlobalGradNorm(pieces, /*sumOver=*/{}, /*maxNorm=*/1.0, ctx.device);
//   tessera::log::info("gradient norm {:.3f}", norm);
double clipGlobalGradNorm(const std::vector<GradPiece>& pieces, const std::vector<CommPtr>& sumOver, double maxNorm,
                          at::Device device);

// The same norm, leaving the gradients to an optimizer that scales them as it reads them
// (optim::AdamW::step(gradScale)): the norm and the coefficient min(1, maxNorm / (norm + 1e-6))
// (1 when maxNorm <= 0), one-element float32 tensors on `device`, with no host synchronisation.
// Collective as clipGlobalGradNorm. Scaling every piece by `coef` is clipGlobalGradNorm's
// scaling bit for bit.
struct GradNormClip {
  at::Tensor norm, coef;
};
GradNormClip globalGradNorm(const std::vector<GradPiece>& pieces, const std::vector<CommPtr>& sumOver, double maxNorm,
                            at::Device device);

}  // namespace tessera
