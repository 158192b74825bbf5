#pragma once
// Tensor-parallel transformer pieces (Megatron layout): activations are [tokens, batch, d]
// (tokens first, so sequence parallel shards dim 0). Forward/backward are collective over tp.
// Construction draws the weights in the same order and from the same RNG state as the
// unsharded pre-LayerNorm GPT block (ln1, qkv Linear(d, 3d), proj Linear(d, d), ln2,
// fc1 Linear(d, 4d), fc2 Linear(4d, d)) and keeps this rank's shards, so a stack built after
// the same manual_seed equals the unsharded stack exactly. qkv's output is laid out
// [q | k | v], each head-major; rank r keeps heads [r·h/tp, (r+1)·h/tp) of q, k and v.
// heads (and d, 4d) not divisible by tp → tessera::Error naming the block and the numbers.
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>

#include "parallel/tensor/linear.h"

namespace tessera::tp {

// Column(d → 4d) → GELU → Row(4d → d).
class ParallelMlpImpl : public torch::nn::Module {
 public:
  ParallelMlpImpl(CommPtr tp, int64_t d, bool sequenceParallel, const std::string& name);
  at::Tensor forward(const at::Tensor& x);
  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};
};
TORCH_MODULE(ParallelMlp);

// Causal self-attention with the heads split across tp.
class ParallelAttentionImpl : public torch::nn::Module {
 public:
  ParallelAttentionImpl(CommPtr tp, int64_t d, int64_t heads, bool sequenceParallel, const std::string& name);
  at::Tensor forward(const at::Tensor& x);  // [S or S/tp, B, d] → same (else an error naming it)
  // Local: the unsharded qkv ([q | k | v], head-major) and proj weights/biases; keeps this
  // rank's heads.
  void loadFull(const at::Tensor& qkvW, const at::Tensor& qkvB, const at::Tensor& projW, const at::Tensor& projB);
  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear proj{nullptr};
  int64_t localHeads, headDim;
  std::string name;
};
TORCH_MODULE(ParallelAttention);

// x + attn(ln1(x)), then + mlp(ln2(·)). With sequenceParallel the LayerNorms and residuals
// run on this rank's token shard and their parameters' gradients are all-reduced over tp.
class ParallelBlockImpl : public torch::nn::Module {
 public:
  ParallelBlockImpl(CommPtr tp, int64_t d, int64_t heads, bool sequenceParallel, const std::string& name);
  at::Tensor forward(const at::Tensor& x);
  // Local: load the unsharded block's parameters from `full`, named as the unsharded block
  // names them (ln1.weight, ln1.bias, qkv.*, proj.*, ln2.*, fc1.*, fc2.*) after `prefix`
  // (e.g. "blocks.0."); keeps this rank's shards. A missing name is an error naming it.
  void loadFull(const torch::OrderedDict<std::string, at::Tensor>& full, const std::string& prefix = "");
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ParallelAttention attn{nullptr};
  ParallelMlp mlp{nullptr};
  CommPtr tp;
  bool sequenceParallel;
  std::string name;
};
TORCH_MODULE(ParallelBlock);

}  // namespace tessera::tp
