#pragma once
// The Llama block over a tensor-parallel group `tp` (Megatron layout: activations [tokens,
// batch, d], [tokens/tp, batch, d] with sequence parallel):
//   h = x + wo(attention(rope(q), rope(k), v)),  q|k|v = wqkv(rmsnorm(x))
//   y = h + w2(silu(w1 a) * w3 a),               a = rmsnorm(h)
// No biases. Heads split over tp: rank r keeps q heads [r·H/tp, (r+1)·H/tp); kv heads (GQA, KV of
// them) are split too when tp divides KV, or, when KV divides tp, each lives on tp/KV ranks (its
// gradient summed over them, as Megatron does); anything else is a tessera::Error naming the block
// and the numbers. This rank's fused wqkv rows are [q_r | k_r | v_r], its w13 rows [w1_r | w3_r].
// Initial weights: llamaBlockInit's unsharded draws (nn::seededNormal, std 0.02; wo and w2 scaled
// by 1/sqrt(2·layers)), of which each rank keeps its shards (docs/design/models.md). Unsharded
// names (checkpoints, loadFull): attn_norm.weight, wq/wk/wv.weight [H·hd | KV·hd, d], wo.weight
// [d, H·hd], mlp_norm.weight, w1/w3.weight [ffn, d], w2.weight [d, ffn]; a sparse layer has moe.*
// (moe.h) instead of w1/w3/w2; qk-norm adds q_norm/k_norm.weight ([hd]; whole: [H·hd], [KV·hd]).
// Forward/backward are collective over tp (and the kv group when kv heads are replicated).
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "tessera/models/block.h"
#include "tessera/models/moe.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/nn/rope.h"
#include "tessera/parallel/tensor/linear.h"

namespace tessera::models {

// x / sqrt(mean(x²) + eps) · weight, in float32, returned in x's dtype. With sequence parallel
// each rank normalises its own tokens and the weight's gradient is summed over `tp`.
// fused: one op (nn::rmsNorm, nn/fused_norm.h), returning CUDA autocast's dtype under autocast.
// With fused ops the block's residual adds go through addForward.
// As the model's final norm its parameter is "norm.weight" (params/pieces after the prefix).
class RmsNormImpl : public LayerImpl {
 public:
  RmsNormImpl(int64_t d, double eps, CommPtr tp = nullptr, bool sequenceParallel = false);
  at::Tensor forward(const at::Tensor& x) override;
  std::vector<NamedParam> params(const std::string& prefix) override;
  std::vector<checkpoint::Piece> pieces(const std::string& prefix) override;
  // The residual add before the norm and the norm: s = x + branch (branch undefined: s = x),
  // y = forward(s); fused: one op (nn::addRmsNorm, which also sums s's residual gradient into its
  // backward), else the add and forward.
  nn::AddNormResult addForward(const at::Tensor& x, const at::Tensor& branch);
  at::Tensor weight;  // [d], ones
  double eps;
  CommPtr tp;
  bool sp;
  bool fused = false;
};
TORCH_MODULE(RmsNorm);

class LlamaBlockImpl : public BlockImpl {
 public:
  // kvGroup: llamaKvGroup(c, tp) (null unless kv heads are replicated). Selective recompute:
  // attention's core and SwiGLU's product.
  LlamaBlockImpl(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, int64_t layer, const LayerOptions& o);
  at::Tensor forward(const at::Tensor& x) override;
  // Local: the unsharded block's tensors, named as above after `prefix`.
  void loadFull(const std::map<std::string, at::Tensor>& full, const std::string& prefix);
  std::vector<checkpoint::Piece> pieces(const std::string& prefix) override;
  std::vector<NamedParam> params(const std::string& prefix) override;
  at::Tensor decode(const at::Tensor& x, KvCache& cache, size_t layer) override;
  int64_t localKvHeads() const override { return lkv_; }

  RmsNorm attnNorm{nullptr}, mlpNorm{nullptr};
  tp::ColumnParallelLinear wqkv{nullptr}, w13{nullptr};
  tp::RowParallelLinear wo{nullptr}, w2{nullptr};  // w13, w2: null in a sparse layer
  Moe moe{nullptr};                                  // a sparse layer's MLP
  at::Tensor qNorm, kNorm;  // qk-norm weights (this rank's slices when whole); undefined without

 private:
  at::Tensor attention(const at::Tensor& x);
  at::Tensor mlp(const at::Tensor& x);
  // q [.., lq, hd] and k [.., lkv, hd] through the qk-norm (unchanged without one).
  std::pair<at::Tensor, at::Tensor> normQk(const at::Tensor& q, const at::Tensor& k) const;
  // loadFull; the experts too when `experts` (the constructor's Moe draws its own).
  void loadParts(const std::map<std::string, at::Tensor>& full, const std::string& prefix, bool experts);
  ModelConfig cfg_;
  CommPtr tp_, kvGroup_;  // kvGroup_: the ranks sharing this rank's kv head (replicated case)
  LayerOptions o_;
  std::string name_;
  int64_t hd_, lq_, lkv_, firstQ_, firstKv_, lffn_;
  int kvReplicas_ = 1;
};
TORCH_MODULE(LlamaBlock);

// The group of tp ranks holding the same kv head when tp > kv heads (split from tp: collective
// over tp); null when the kv heads are split. Checks the head counts against tp.
CommPtr llamaKvGroup(const ModelConfig& c, const CommPtr& tp);

// The unsharded block drawn as the constructor draws it (CPU, float32), by unsharded name; a sparse
// layer's experts are moeInit's, under "moe.".
std::map<std::string, at::Tensor> llamaBlockInit(const ModelConfig& c, int64_t layer, uint64_t seed,
                                                 bool experts = true);

}  // namespace tessera::models
