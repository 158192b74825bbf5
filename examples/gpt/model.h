#pragma once
// The GPT that train_gpt trains, built from tessera's tensor-parallel layers and cut into
// pipeline chunks. The architecture is the anchors' GPT (bench/common/gpt.h,
// ../shared/anchors/torch_anchor.py): token embedding (no positions), `layers` pre-LayerNorm
// blocks (heads split over tp), final LayerNorm, untied head without bias; the loss is the
// vocab-parallel cross-entropy (full logits never gathered). Activations between blocks are
// [T, b, d] ([T/tp, b, d] with sequence parallel).
//
// Initialisation is a function of (seed, layer) only: block i is drawn after
// torch::manual_seed(blockSeed(seed, i)), the embedding from its own generator, the head after
// manual_seed(headSeed(seed)). So a chunk holding blocks [a, b) of any pp/tp layout starts from
// exactly the shards of the same unsharded model, and pp1 × tp1 is the single-process model.
//
// A chunk is a list of parts (embedding; one per block; final LayerNorm + head), each a
// function of one tensor: run them in order, or each inside an FSDP unit (fsdpUnits()).
// Forward and backward are collective over `tp`. Construction is local (no communication).
#include <torch/nn/module.h>
#include <torch/nn/modules/normalization.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "parallel/grad_norm.h"
#include "parallel/tensor/blocks.h"
#include "parallel/tensor/linear.h"
#include "parallel/tensor/vocab.h"
#include "pipeline/partition.h"
#include "sharding/fsdp/unit.h"

namespace tessera::gpt {

struct GptConfig {
  int64_t d = 64, layers = 4, heads = 4, vocab = 256, seqLen = 32;
  std::string describe() const;
};
// "tiny" (CPU tests and the CPU main job), "small" (d 512, 8 layers), "735m" (the anchors'
// GPT-735M: d 2048, 12 layers, 16 heads, vocab 32000, T 1024). Unknown name → tessera::Error.
GptConfig presetConfig(const std::string& name);
int64_t blockParamCount(const GptConfig& c);  // 12 d² + 13 d
int64_t paramCount(const GptConfig& c);       // L (12 d² + 13 d) + 2 V d + 2 d
double flopsPerToken(const GptConfig& c);     // 6 N + 12 L d T (as the anchors count)
uint64_t blockSeed(uint64_t seed, int64_t layer);
uint64_t headSeed(uint64_t seed);

// Pipeline partition of the GPT's blocks into pp · chunks stages, balanced by compute (the
// embedding is a lookup) unless layersPerStage is given. Throws naming the numbers.
pipeline::Partition partitionGpt(const GptConfig& c, int pp, int chunks, const std::vector<int>& layersPerStage);

// A parameter of a chunk with its place in the unsharded model (for checkpoints and clipping).
struct ChunkParam {
  std::string name;  // the unsharded model's name: "emb.weight", "blocks.3.attn.qkv.weight", "lnf.bias", "head.weight"
  at::Tensor tensor;
  bool replicatedOverTp = false;  // LayerNorms and row-parallel biases: the same on every tp rank
};

class GptChunkImpl : public torch::nn::Module {
 public:
  using Part = std::function<at::Tensor(const at::Tensor&)>;
  // Stage `stage` of `part`: the embedding when stage 0, blocks [firstBlock, endBlock), final
  // LayerNorm + head when the last stage. sp: sequence parallel (T divisible by tp).
  GptChunkImpl(const GptConfig& c, CommPtr tp, const pipeline::Partition& part, int stage, bool sequenceParallel,
               uint64_t seed);
  // Stage 0: tokens [b, T] int64; else activations. Last stage: logits [T, b, V/tp].
  at::Tensor forward(const at::Tensor& x);
  std::vector<Part> parts();
  // One FSDP unit per part, in part order, named "<stage>.emb", "<stage>.block<i>", "<stage>.head".
  std::vector<FsdpUnitSpec> fsdpUnits();
  std::vector<ChunkParam> params();
  // Checkpoint pieces of the parameters (their unsharded names; see tp/checkpoint_pieces.h).
  std::vector<checkpoint::Piece> pieces();

  GptConfig cfg;
  CommPtr tp;
  bool sp, first, last;
  int stage, firstBlock, endBlock;
  tp::VocabParallelEmbedding emb{nullptr};
  std::vector<tp::ParallelBlock> blocks;
  torch::nn::LayerNorm lnf{nullptr};
  tp::ColumnParallelLinear head{nullptr};

 private:
  at::Tensor embed(const at::Tensor& tokens);
  at::Tensor finalNormHead(const at::Tensor& x);
};
TORCH_MODULE(GptChunk);

// Mean cross-entropy of logits [T, b, V/tp] (this rank's vocab columns) against targets
// [b, T] (global ids). Collective over tp; float32 scalar, the same on every tp rank.
at::Tensor gptLoss(const at::Tensor& logitsShard, const at::Tensor& targets, const CommPtr& tp, int64_t vocab);

}  // namespace tessera::gpt
