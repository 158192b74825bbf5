#pragma once
// The pieces a model family plugs into the decoder-only LM (lm.h): its transformer block and its
// final norm, behind one interface. Activations are [tokens, batch, d] ([tokens/tp, batch, d]
// with sequence parallel); forward and backward are collective over the block's tp group.
// Construction is local and draws the weights as a function of (seed, layer) only, so every
// layout starts from the shards of the same unsharded model.
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"
#include "tessera/nn/recompute.h"
#include "tessera/parallel/param.h"

namespace tessera::models {

struct KvCache;  // kv_cache.h

// How a chunk's layers are built (every family takes the same).
struct LayerOptions {
  bool sequenceParallel = false;  // tokens divisible by tp
  nn::Recompute recompute = nn::Recompute::None;
  uint64_t seed = 1234;
  // tessera's fused ops (norms with the residual adds, rotary in place, SwiGLU / bias + GELU):
  // CUDA kernels on GPUs, their ATen references on CPU; the same maths as the ATen ops.
  bool fusedKernels = false;
  // Context parallel (parallel/context/): the cp group, or null. Layers then see this cp rank's
  // T / cp positions of every sequence and attention gathers K and V over the group.
  CommPtr context;
  bool repeatKvHeads = false;  // Llama GQA: k and v repeated to the query heads before attention
  // Mixture of experts (moe.h): the expert-parallel group (null: every expert on this rank) and
  // the factor of the auxiliary losses' gradients (the trainer's factor of the LM loss).
  CommPtr experts;
  double moeLossScale = 1.0;
  bool moeForceBalanced = false;  // MoeOptions::forceBalanced (benchmarks)
};

// A layer with one input and one output: a transformer block or the final norm.
class LayerImpl : public torch::nn::Module {
 public:
  ~LayerImpl() override = default;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // Local: its parameters under the unsharded model's names after `prefix` ("blocks.3."), with
  // their replication over tp (gradient-norm weights, checkpoints, weight decay).
  virtual std::vector<NamedParam> params(const std::string& prefix) = 0;
  // Local: checkpoint pieces of its parameters, each this rank's box of the unsharded tensor.
  virtual std::vector<checkpoint::Piece> pieces(const std::string& prefix) = 0;
};

class BlockImpl : public LayerImpl {
 public:
  // Inference (kv_cache.h): x [n, b, d] at positions [cache.length, cache.length + n); appends
  // this block's keys and values to cache.k/v[layer]. No autograd, no sequence parallel.
  virtual at::Tensor decode(const at::Tensor& x, KvCache& cache, size_t layer) = 0;
  // The kv heads this rank keeps in a cache.
  virtual int64_t localKvHeads() const = 0;
};

using Layer = std::shared_ptr<LayerImpl>;
using Block = std::shared_ptr<BlockImpl>;

// The seeds of block `layer`'s weights and of the head's, from the run's seed.
uint64_t blockSeed(uint64_t seed, int64_t layer);
uint64_t headSeed(uint64_t seed);

// The family's block `layer` and final norm (family.cpp dispatches on c.arch). kvGroup: Llama's
// (llamaKvGroup), null otherwise. Errors name the block and the numbers that do not fit tp.
Block makeBlock(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, int64_t layer, const LayerOptions& o);
Layer makeFinalNorm(const ModelConfig& c, CommPtr tp, const LayerOptions& o);
// The tp sub-group a family's blocks need beyond tp itself (Llama with kv heads replicated over tp
// ranks), or null. Collective over tp when it splits.
CommPtr familyGroup(const ModelConfig& c, const CommPtr& tp);

}  // namespace tessera::models
