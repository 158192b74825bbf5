#pragma once
// A decoder-only language model, or the chunk of it one pipeline stage holds: the token embedding
// (vocab-parallel; GPT: + learned positions) on the first stage, blocks [firstBlock, endBlock) of
// the family (block.h), the final norm and the head (column-parallel over the vocabulary; tied:
// the embedding table, copied onto the last stage when pp > 1) on the last. Activations between
// parts are [T, b, d] ([T/tp, b, d] with sequence parallel). The loss is the vocab-parallel
// cross-entropy (full logits never gathered). Forward and backward are collective over tp (and
// cp); construction is local. The whole model (ChunkRange::whole) of any tp is the single-process
// model's shards.
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/models/block.h"
#include "tessera/models/config.h"
#include "tessera/parallel/param.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/tensor/vocab.h"

namespace tessera::models {

// Which part of the model a chunk holds: pipeline stage `stage` of `stages`, blocks
// [firstBlock, endBlock) (the embedding with stage 0, the norm and head with the last).
struct ChunkRange {
  int stage = 0, stages = 1;
  int firstBlock = 0, endBlock = 0;
  static ChunkRange whole(const ModelConfig& c) { return {0, 1, 0, static_cast<int>(c.layers)}; }
};

class LmChunkImpl : public torch::nn::Module {
 public:
  // kvGroup: familyGroup(c, tp) (Llama with kv heads replicated over tp), else null.
  LmChunkImpl(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, ChunkRange range, LayerOptions o);
  // Stage 0: tokens [b, T] int64 (T / cp: this cp rank's positions); else activations. Last
  // stage: logits [T, b, V/tp].
  at::Tensor forward(const at::Tensor& x);
  // The forward in parts, in order: "emb" (lookup), "pos" (GPT learned positions), "block<i>",
  // "norm", "head", each with the parameters it owns; a tied head on the embedding's stage owns
  // none and shares emb's table. With sequence parallel the tokens are split after emb (or pos).
  std::vector<ModelPart> parts();
  std::vector<NamedParam> params();  // every part's, in order
  // Checkpoint pieces of the parameters under the unsharded model's names.
  std::vector<checkpoint::Piece> pieces();
  // The tied table this chunk holds (the embedding's, or the last stage's copy); undefined unless
  // the embeddings are tied and this chunk is the first or the last stage.
  at::Tensor tiedTable();
  // The head on final-norm outputs h [T, b, d]: logits [T, b, V/tp] (last stage).
  at::Tensor logits(const at::Tensor& h);

  ModelConfig cfg;
  CommPtr tp;
  LayerOptions opts;
  ChunkRange range;
  bool first, last;
  int64_t localT = 0;  // positions per sequence on this rank: T, or T / cp
  tp::VocabParallelEmbedding emb{nullptr};
  at::Tensor pos;         // GPT learned positions [T, d] (first stage)
  at::Tensor headTable;   // tied, pp > 1, last stage: the copy of the table [V/tp, d]
  std::vector<Block> blocks;
  Layer norm;                              // the family's final norm (last stage)
  tp::ColumnParallelLinear head{nullptr};  // untied

 private:
  at::Tensor embed(const at::Tensor& tokens);
  at::Tensor addPositions(const at::Tensor& x);
  at::Tensor block(size_t i, const at::Tensor& x);
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
