#pragma once
// The mixture-of-experts MLP of a sparse Llama layer (ModelConfig::moe) on tokens x [..., d]:
// float32 router scores (softmax or sigmoid of x Wrᵀ), top-k of scores + bias (the bias only
// chooses; ties go to the lower expert), weights = chosen scores (renormalised when normTopK) ·
// routedScale, y = Σ_k weight · SwiGLU_expert(x) + SwiGLU_shared(x). Dropless unless
// capacityFactor > 0 (then assignments past ceil(f · N · k / E) per expert are dropped, counted).
// The auxiliary losses (balance, z) are added to the gradient where y's gradient arrives, times
// MoeOptions::lossScale; they are not returned. Expert parallel (MoeOptions::ep of P ranks):
// rank q keeps experts [q·E/P, (q+1)·E/P); tokens travel to them and back by point-to-point
// exchanges (collective over ep in forward and backward; counts read on the host); an expert's
// weight gradient is the mean of what the P ranks' tokens give it (÷ P, as a data-parallel mean;
// params() marks those weights `expert`). Weights drawn from (seed, layer, expert) only: every ep
// starts from the same model. Replicated over tp (with sequence parallel their gradients are
// summed over tp). Construction is local; errors name the layer and the numbers.
// docs/design/models.md ("Mixture of experts"): the conventions and why.
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"
#include "tessera/parallel/param.h"

namespace tessera::models {

struct MoeOptions {
  CommPtr ep;  // expert-parallel group; null or one rank: every expert here
  CommPtr tp;  // with sequenceParallel, the weights' gradients are summed over tp
  bool sequenceParallel = false;
  double lossScale = 1.0;  // the auxiliary losses' gradient factor
  uint64_t seed = 1234;
  // Benchmarks only: the experts are chosen by position, token i of this rank's forward to experts
  // (i·k + j) mod E, j < k (every expert the same load when N·k divides by E); the router's scores
  // of those experts still weigh them (and take gradients). The same rule as bench/moe/anchor.py's.
  bool forceBalanced = false;
};

// Routing and load of the training forwards (autograd on: not validation, not the pipeline's shape
// probe; with full recompute, the recomputation) since the last reset (this rank's tokens).
struct MoeStats {
  at::Tensor load;      // [E] int64: assignments per expert (kept ones)
  int64_t dropped = 0;  // assignments over capacity
  int64_t tokens = 0;
  double auxLoss = 0, zLoss = 0;  // the last forward's, before coefficients
};

class MoeImpl : public torch::nn::Module {
 public:
  MoeImpl(const ModelConfig& c, int64_t layer, MoeOptions o);
  at::Tensor forward(const at::Tensor& x);
  // Local: unsharded tensors by name after `prefix` ("blocks.1.moe.").
  void loadFull(const std::map<std::string, at::Tensor>& full, const std::string& prefix);
  std::vector<NamedParam> params(const std::string& prefix);
  std::vector<checkpoint::Piece> pieces(const std::string& prefix);  // the bias included
  // Auxiliary-loss-free balancing: the load since the last call, summed over `groups` (the ranks
  // whose tokens these replicas route: data, context and, with sequence parallel, tensor ranks;
  // none: this rank's), moves each expert's selection bias by biasUpdateRate towards the mean
  // load: bias_e += rate · sign(mean − load_e), equal on every rank of the groups. Collective over
  // each group. The load is reset; the bias is left alone when the rate is 0.
  void updateBias(const std::vector<CommPtr>& groups);
  // The same with the load already summed over those groups ([E], any dtype, any device): local.
  void updateBiasFrom(const at::Tensor& summedLoad);
  MoeStats takeStats();  // local; resets the counters
  // The same without a host wait: [E + 3] float32 on the weights' device: the load per expert since
  // the last reset, the last forward's balance and z losses (0 when not computed), the dropped
  // assignments. Local; resetLoad() zeroes the load and the drops (updateBias does too).
  at::Tensor statsOnDevice() const;
  void resetLoad();

  at::Tensor router;         // [E, d]
  at::Tensor w1, w3, w2;     // this rank's experts: [El, f, d], [El, f, d], [El, d, f]
  at::Tensor sw1, sw3, sw2;  // shared: [fs, d], [fs, d], [d, fs]; undefined when fs = 0
  at::Tensor bias;           // [E] float32 buffer
  // The routed experts' forward GEMMs in FP8 (E4M3, a scale per token row and per expert output
  // feature) where the grouped kernel runs (CUDA sm_90); backward and the shared experts in bf16.
  // Set by the trainer under --fp8 --fp8-experts (either recipe: the grouped kernel takes rowwise
  // scales only).
  bool fp8 = false;

  int64_t firstExpert() const { return first_; }
  int64_t localExperts() const { return local_; }

 private:
  // counts: [E] int64, the assignments to each expert (the routing's).
  at::Tensor experts(const at::Tensor& x2d, const at::Tensor& chosen, const at::Tensor& weights, at::Tensor counts);
  // A weight as the layer uses it: with sequence parallel over tp, through tp::copyToRegion (its
  // gradient summed over tp, as every tp rank routes other tokens).
  at::Tensor region(const at::Tensor& w) const;
  ModelConfig cfg_;
  MoeOptions o_;
  std::string name_;
  int64_t first_ = 0, local_ = 0;
  at::Tensor load_;  // [E] int64, accumulating
  int64_t dropped_ = 0, tokens_ = 0;
  at::Tensor aux_, z_;  // the last forward's, detached (read in takeStats: no host wait in forward)
};
TORCH_MODULE(Moe);

// The unsharded MoE weights of block `layer` as the constructor draws them (CPU, float32), named
// router.weight, w1.weight, w3.weight, w2.weight, shared.w1.weight, ... (no prefix).
std::map<std::string, at::Tensor> moeInit(const ModelConfig& c, int64_t layer, uint64_t seed);

}  // namespace tessera::models
