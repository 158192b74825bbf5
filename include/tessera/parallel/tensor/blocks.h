#pragma once
// Tensor-parallel transformer pieces (Megatron layout): activations are [tokens, batch, d]
// (tokens first, so sequence parallel shards dim 0). Forward/backward are collective over tp.
// Construction draws the weights in the same order and from the same RNG state as the
// unsharded pre-LayerNorm GPT block (ln1, qkv Linear(d, 3d), proj Linear(d, d), ln2,
// fc1 Linear(d, 4d), fc2 Linear(4d, d)) and keeps this rank's shards, so a stack built after
// the same manual_seed equals the unsharded stack exactly. qkv's output is laid out
// [q | k | v], each head-major; rank r keeps heads [r·h/tp, (r+1)·h/tp) of q, k and v.
// heads (and d, 4d) not divisible by tp, or a dropout p outside [0, 1) → tessera::Error naming
// the block and the numbers.
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>

#include "tessera/nn/fused_norm.h"
#include "tessera/parallel/tensor/linear.h"

namespace tessera::tp {

// ln(x) for a LayerNorm inside a tensor-parallel region: with sequenceParallel each rank
// normalises its own tokens, so the weight's and bias's gradients are summed over tp
// (copyToRegion); fused: nn::layerNorm (nn/fused_norm.h), else at::layer_norm. Local in forward.
at::Tensor tpLayerNorm(torch::nn::LayerNorm& ln, const at::Tensor& x, const CommPtr& tp, bool sequenceParallel,
                       bool fused);
// The residual add before such a LayerNorm fused with it: nn::addLayerNorm(x, branch, ...) (s =
// x + branch, y = ln(s); branch may be undefined: s is x), parameters as tpLayerNorm. Local.
nn::AddNormResult tpAddLayerNorm(torch::nn::LayerNorm& ln, const at::Tensor& x, const at::Tensor& branch,
                                 const CommPtr& tp, bool sequenceParallel);

// Column(d → ffn) → GELU → Row(ffn → d); ffn 0: 4 d.
class ParallelMlpImpl : public torch::nn::Module {
 public:
  ParallelMlpImpl(CommPtr tp, int64_t d, bool sequenceParallel, const std::string& name, int64_t ffn = 0);
  at::Tensor forward(const at::Tensor& x);
  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};
  bool recomputeActivation = false;  // selective recompute: GELU's output is recomputed in backward
  // fc1's bias added with the GELU in one op (nn::biasGelu, nn/fused_activations.h; keeps only
  // its input, as recomputeActivation does) after fc1's GEMM without it.
  bool fusedActivation = false;
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
  bool recomputeCore = false;  // selective recompute: softmax(q kᵀ) v is recomputed in backward
  double ropeTheta = 0;        // > 0: rotary positions (nn/rope.h) on q and k; 0: none
  // Context parallel (parallel/context/): the cp group, or null. The input then holds this cp
  // rank's positions of each sequence (rotary angles at their global positions) and attention
  // gathers K and V over the group.
  CommPtr context;
  bool fusedRope = false;      // rotary positions in place on qkv's output (nn::ropeQkInPlace)
};
TORCH_MODULE(ParallelAttention);

// Hidden (residual) dropout of a block: on the attention output and on the MLP output, before
// each residual add. p = 0 (the default) is no dropout: nothing drawn, nothing multiplied.
struct BlockDropout {
  double p = 0;       // probability of zeroing an element, in [0, 1)
  uint64_t seed = 0;  // seed of the masks; must be equal on every rank of tp (differ per block)
};
// The seed of a block's k-th masked forward: seed + k·0x9E3779B97F4A7C15 (mod 2^64).
uint64_t blockDropoutSeed(uint64_t seed, int64_t call);

// x + drop(attn(ln1(x))), then + drop(mlp(ln2(·))). With sequenceParallel the LayerNorms,
// dropouts and residuals run on this rank's token shard and the LayerNorms' parameter
// gradients are all-reduced over tp.
// Dropout (dropout.p > 0, training mode only: in eval mode, as with p = 0, nothing is drawn):
// the k-th such forward (k = dropoutCalls, then incremented) draws both masks from a fresh
// generator of the input's device (CPU: at::CPUGeneratorImpl; CUDA: a clone of the device's
// Philox generator) seeded blockDropoutSeed(dropout.seed, k): first the attention output's, then
// the MLP output's, each as bernoulli(1 − p) over the FULL [tokens, batch, d] tensor in the
// activation's dtype, scaled by 1 / (1 − p). With sequenceParallel each rank keeps its own token
// rows (a copy, so the full mask is freed at once). So the masks are those of the unsharded
// block and of any tp degree (tests/models' GptBlock draws the same), at a cost: every rank
// draws the full tensor's random numbers, tp times what its shard needs, and holds the full
// mask briefly. The masks repeat across model replicas built with equal seeds (data-parallel
// ranks): give those different seeds if they must differ. A forward run again for the same
// batch (activation recomputation) must first restore dropoutCalls, and dropoutCalls is not in
// the checkpoint pieces (checkpoint_pieces.h): a resumed run sets it to continue the masks.
// No communication.
class ParallelBlockImpl : public torch::nn::Module {
 public:
  ParallelBlockImpl(CommPtr tp, int64_t d, int64_t heads, bool sequenceParallel, const std::string& name,
                    BlockDropout dropout = {}, int64_t ffn = 0);
  at::Tensor forward(const at::Tensor& x);
  // Local: load the unsharded block's parameters from `full`, named as the unsharded block
  // names them (ln1.weight, ln1.bias, qkv.*, proj.*, ln2.*, fc1.*, fc2.*) after `prefix`
  // (e.g. "blocks.0."); keeps this rank's shards. A missing name is an error naming it.
  void loadFull(const torch::OrderedDict<std::string, at::Tensor>& full, const std::string& prefix = "");
  // tessera's fused ops for the LayerNorms (tpAddLayerNorm: ln1 with the residual path's
  // gradient added in its backward, ln2 with the attention's residual add), the rotary embedding
  // and bias + GELU (attn->fusedRope, mlp->fusedActivation): the same maths as the ATen ops. Local.
  void setFusedKernels(bool on);
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ParallelAttention attn{nullptr};
  ParallelMlp mlp{nullptr};
  CommPtr tp;
  bool sequenceParallel;
  std::string name;
  BlockDropout dropout;
  int64_t dropoutCalls = 0;  // the dropout RNG's state: masked forwards so far
  bool fusedNorms = false;   // setFusedKernels

 private:
  at::Tensor drop(const at::Tensor& v, at::Generator& gen) const;
};
TORCH_MODULE(ParallelBlock);

}  // namespace tessera::tp
