#pragma once
// A pipeline chunk of a decoder-only language model (config.h: GPT or Llama) built from
// tessera's tensor-parallel layers: token embedding (vocab-parallel; GPT: + learned positions)
// on the first stage, the stage's blocks, final norm + head (column-parallel over the vocab)
// on the last. The loss is the vocab-parallel cross-entropy (full logits never gathered).
// Activations between blocks are [T, b, d] ([T/tp, b, d] with sequence parallel).
//
// Initialisation is a function of (seed, layer) only (blocks: blockSeed; embedding and head:
// their own seeds), so a chunk holding blocks [a, b) of any pp/tp layout starts from exactly the
// shards of the same unsharded model, and pp1 x tp1 is the single-process model.
// Tied embeddings: the head multiplies by the embedding table. On one stage that is one tensor;
// with pp > 1 the first and the last stage each hold a copy (equal at initialisation; the
// trainer sums their gradients over the embedding group, as Megatron does).
//
// A chunk is a list of parts (embedding; one per block; final norm + head), each a function of
// one tensor: run them in order, or each inside an FSDP unit (fsdpUnits()). With full
// recompute each block's part recomputes its forward in backward (recompute.h).
// Forward and backward are collective over tp. Construction is local.
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "models/config.h"
#include "models/llama.h"
#include "models/param.h"
#include "nn/recompute.h"
#include "parallel/tensor/blocks.h"
#include "parallel/tensor/linear.h"
#include "parallel/tensor/vocab.h"
#include "pipeline/partition.h"
#include "sharding/fsdp/unit.h"

namespace tessera::models {

uint64_t blockSeed(uint64_t seed, int64_t layer);
uint64_t headSeed(uint64_t seed);

// Pipeline partition of the blocks into pp · chunks stages, balanced by compute (the embedding
// is a lookup) unless layersPerStage is given. Throws naming the numbers.
pipeline::Partition partitionModel(const ModelConfig& c, int pp, int chunks, const std::vector<int>& layersPerStage);

struct ChunkOptions {
  bool sequenceParallel = false;  // T divisible by tp
  Recompute recompute = Recompute::None;
  uint64_t seed = 1234;
  // tessera's fused ops in every block and the final norm (LlamaBlockOptions::fusedKernels,
  // tp::ParallelBlockImpl::setFusedKernels): CUDA kernels on GPUs, their ATen references on CPU.
  // The loss takes them through lmLoss's `fused`.
  bool fusedKernels = false;
  // Context parallel (parallel/context/): the cp group, or null. The chunk then takes this cp
  // rank's T / cp positions of every sequence (chunks.h: tokens [b, T / cp]), learned positions
  // and rotary angles at their global positions, and its blocks' attention gathers K and V.
  CommPtr contextGroup;
  bool repeatKvHeads = false;  // LlamaBlockOptions::repeatKvHeads
};

class LmChunkImpl : public torch::nn::Module {
 public:
  using Part = std::function<at::Tensor(const at::Tensor&)>;
  // Stage `stage` of `part`. kvGroup: llamaKvGroup(c, tp) for Llama (null otherwise).
  LmChunkImpl(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, const pipeline::Partition& part, int stage,
              ChunkOptions o);
  // Stage 0: tokens [b, T] int64; else activations. Last stage: logits [T, b, V/tp].
  at::Tensor forward(const at::Tensor& x);
  // Parts in order: "emb" (lookup), "pos" (GPT learned positions), "block<i>", "norm" (final
  // norm), "head". With sequence parallel the tokens are split after emb (or pos).
  std::vector<Part> parts();
  // The FSDP units, named "stage<s>.<part>", and the unit each part runs in: one per part, but
  // for tied embeddings on one stage the head runs in the emb unit (a root unit: not resharded
  // after forward). The table's units (emb, and the last stage's head with pp > 1) hold only
  // the table, so their flat layouts are equal and their gradient shards can be summed.
  std::vector<FsdpUnitSpec> fsdpUnits();
  std::vector<size_t> partUnits();
  // The index (in fsdpUnits()) of the unit holding the tied table; -1 if none.
  int tiedUnit();
  std::vector<ChunkParam> params();
  // Checkpoint pieces of the parameters under the unsharded model's names.
  std::vector<checkpoint::Piece> pieces();
  // The tied table held by this chunk (the embedding's, or the last stage's copy); undefined
  // unless the embeddings are tied and this chunk is the first or the last stage.
  at::Tensor tiedTable();

  ModelConfig cfg;
  CommPtr tp;
  ChunkOptions opts;
  bool first, last;
  int stage, firstBlock, endBlock;
  int64_t localT = 0;  // positions per sequence on this rank: T, or T / cp
  tp::VocabParallelEmbedding emb{nullptr};
  at::Tensor pos;         // GPT learned positions [T, d] (first stage)
  at::Tensor headTable;   // tied, pp > 1, last stage: the copy of the table [V/tp, d]
  std::vector<tp::ParallelBlock> gptBlocks;
  std::vector<LlamaBlock> llamaBlocks;
  torch::nn::LayerNorm lnf{nullptr};  // GPT
  RmsNorm norm{nullptr};              // Llama
  tp::ColumnParallelLinear head{nullptr};  // untied

 private:
  at::Tensor embed(const at::Tensor& tokens);
  at::Tensor addPositions(const at::Tensor& x);
  at::Tensor finalNorm(const at::Tensor& x);
  at::Tensor applyHead(const at::Tensor& x);
  at::Tensor block(size_t i, const at::Tensor& x);
  bool headInEmbUnit() const { return cfg.tiedEmbeddings && first && last; }
  std::vector<std::pair<std::string, std::function<std::vector<ChunkParam>()>>> partParams();
};
TORCH_MODULE(LmChunk);

// Mean cross-entropy of logits [T, b, V/tp] (this rank's vocab columns) against targets
// [b, T] (global ids). Collective over tp; float32 scalar, the same on every tp rank.
// fused: tp::vocabParallelCrossEntropy's fused kernels (no float32 copy of the logits), whose
// backward writes the gradient over logitsShard (gradInLogits: the logits are dead after the loss;
// read them before backward, and backpropagate the loss once).
at::Tensor lmLoss(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp, int64_t vocab,
                  bool fused = false);

}  // namespace tessera::models
