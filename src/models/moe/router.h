#pragma once
// The MoE router's maths (models/moe.h), local: scores, the deterministic top-k, the chosen
// probabilities and the auxiliary losses, all in float32.
#include <ATen/core/Tensor.h>

#include "tessera/models/config.h"

namespace tessera::models::moe_detail {

struct Routing {
  at::Tensor logits;   // [N, E] float32
  at::Tensor scores;   // [N, E] float32: softmax or sigmoid of the logits
  at::Tensor chosen;   // [N, k] int64: the experts of each token, best first (ties: lower expert)
  at::Tensor weights;  // [N, k] float32: their probabilities as the combine uses them
  at::Tensor counts;   // [E] int64: the assignments to each expert
};

// x2d [N, d]; router [E, d]; bias [E] (selection only; may be undefined). forceBalanced: token i to
// experts (i·k + j) mod E instead of the top k (MoeOptions::forceBalanced).
Routing route(const at::Tensor& x2d, const at::Tensor& router, const at::Tensor& bias, const MoeConfig& m,
              bool forceBalanced = false);
// E · Σ_e f_e P_e with f_e = (assignments to e) / N and P_e the mean (per-token renormalised, for
// sigmoid) score: HF's load_balancing_loss_func on one layer. Differentiable through the scores.
at::Tensor balanceLoss(const Routing& r, const MoeConfig& m);
// mean over tokens of logsumexp(logits)².
at::Tensor zLoss(const Routing& r);
// Adds `loss`'s gradient (1 · its own gradient) where y's gradient arrives: returns y unchanged.
at::Tensor attachLoss(const at::Tensor& y, const at::Tensor& loss);

}  // namespace tessera::models::moe_detail
