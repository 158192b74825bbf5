#pragma once
// The GPT family (config.h: Arch::Gpt): pre-LayerNorm blocks with biases and a GELU MLP over the
// tensor-parallel layers (tp::ParallelBlock, parallel/tensor/blocks.h), learned, rotary or no
// positions, and a final LayerNorm. Weights are drawn from torch's generator seeded
// blockSeed(seed, layer) in the unsharded block's order, so any tp keeps shards of one model.
// The unsharded names: blocks.<i>.{ln1,qkv,proj,ln2,fc1,fc2}.{weight,bias}, lnf.{weight,bias}.
#include <torch/nn/modules/normalization.h>

#include "tessera/models/block.h"
#include "tessera/parallel/tensor/blocks.h"

namespace tessera::models {

class GptBlockImpl : public BlockImpl {
 public:
  GptBlockImpl(const ModelConfig& c, CommPtr tp, int64_t layer, const LayerOptions& o);
  at::Tensor forward(const at::Tensor& x) override;
  std::vector<NamedParam> params(const std::string& prefix) override;
  std::vector<checkpoint::Piece> pieces(const std::string& prefix) override;
  at::Tensor decode(const at::Tensor& x, KvCache& cache, size_t layer) override;
  int64_t localKvHeads() const override { return block->attn->localHeads; }

  tp::ParallelBlock block{nullptr};

 private:
  ModelConfig cfg_;
};

// The final LayerNorm over tp (its gradient summed over tp with sequence parallel).
class GptFinalNormImpl : public LayerImpl {
 public:
  GptFinalNormImpl(const ModelConfig& c, CommPtr tp, const LayerOptions& o);
  at::Tensor forward(const at::Tensor& x) override;
  std::vector<NamedParam> params(const std::string& prefix) override;
  std::vector<checkpoint::Piece> pieces(const std::string& prefix) override;

  torch::nn::LayerNorm ln{nullptr};
  CommPtr tp;
  bool sequenceParallel, fused;
};

}  // namespace tessera::models
