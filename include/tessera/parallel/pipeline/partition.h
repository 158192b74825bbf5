#pragma once
// Stage partition of a sequential model: embedding → blocks[0..n) → head (+ loss), split
// into pp · chunks contiguous stages. Stage s = chunk · pp + rank (see schedule.h); stage 0
// also runs the embedding, the last stage the head. Local and pure (no communication):
// every rank computes the same partition from the same inputs.
//
// - Balanced (default): contiguous ranges of blocks minimising the largest stage's
//   parameter count, the embedding's parameters counted on stage 0 and the head's on the
//   last stage. Every stage gets at least one block.
// - Explicit: `layersPerStage` (one entry per stage, in stage order) must have pp · chunks
//   entries, each >= 1, summing to the number of blocks.
// Anything else throws tessera::Error naming the numbers; no block is ever dropped.
#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct PartitionOptions {
  int pp = 1;
  int chunks = 1;                   // virtual stages per rank (interleaving)
  std::vector<int> layersPerStage;  // empty: balanced by parameter count
  int64_t embeddingParams = 0;      // counted on stage 0 when balancing
  int64_t headParams = 0;           // counted on the last stage when balancing
  // Balance by compute instead of storage: the embedding is a table lookup, so it costs
  // nothing when balancing (its parameters still live on stage 0 and count in
  // Partition::params), while the head's GEMM costs its parameter count like a block's. On a
  // GPT whose untied embedding and head are as large as a block or more, this moves blocks
  // from the last stage to the first, where the head and loss do not run.
  bool embeddingIsLookup = false;
  bool vShape = false;  // ZB-V's placement of the stages on ranks (schedule.h): only stageOf changes
};

struct Partition {
  int pp = 1, chunks = 1;
  bool vShape = false;         // PartitionOptions::vShape
  std::vector<int> bounds;     // numStages() + 1 entries: stage s owns blocks [bounds[s], bounds[s+1])
  std::vector<int64_t> params;  // per stage, embedding/head included

  int numStages() const { return pp * chunks; }
  int stageOf(int rank, int chunk) const { return stageOfRank(pp, rank, chunk, vShape); }
  int firstBlock(int stage) const { return bounds.at(stage); }
  int endBlock(int stage) const { return bounds.at(stage + 1); }
  std::string describe() const;  // "stage 0: blocks [0, 3) 1234 params; ..."
};

// blockParams[i]: parameter count of block i.
Partition partitionBlocks(const std::vector<int64_t>& blockParams, const PartitionOptions& o);

// A sequential model as torch modules. embedding/head may be empty (is_empty()): identity.
// Every module's forward takes and returns one tensor.
struct SequentialModel {
  torch::nn::AnyModule embedding;
  std::vector<torch::nn::AnyModule> blocks;
  torch::nn::AnyModule head;
};

// Stage `stage` of `model` under `part`: its forward (embedding if stage 0, its blocks,
// head if last) and its parameters (for the optimiser, DDP, ...). The modules are shared
// with `model`, not copied.
struct StageModule {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
};
StageModule buildStage(const SequentialModel& model, const Partition& part, int stage);

// Balanced (or explicit, when o.layersPerStage is set) partition of `model`.
Partition partitionModel(const SequentialModel& model, PartitionOptions o);

}  // namespace tessera::pipeline
