#pragma once
// The benchmarks' model: src/models' GPT, the one train_gpt trains (models/lm.h), in the shape of
// the anchors' GPT-735M (../shared/anchors; bench/torch_anchor.py is PyTorch's side): d 2048,
// 12 pre-LayerNorm blocks with biases, heads of 128, GELU MLP of 4 d, vocabulary 32000, T 1024,
// no positions, final LayerNorm, untied head without bias (the "735m" preset). Every driver
// builds it through buildModel, so every parallel layout starts from the same weights (seeded
// per block, models/lm.h), and bench/torch_anchor.py can start from them too (tessera_init).
// Local to one process; not thread-safe.
#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "tessera/comm/communicator.h"
#include "tessera/models/config.h"
#include "tessera/models/lm.h"

namespace tessera::bench {

// The initial weights' seed (models::LayerOptions::seed) and the first batch's generator seed.
constexpr uint64_t kModelSeed = 1234;
constexpr uint64_t kDataSeed = 1234;

// The "735m" preset with the anchor's environment applied (the driver's top reads it): D, L, V, T
// override d, blocks, vocabulary and sequence length; heads are d / 128 (at least 1), as the
// anchor's. A malformed value is a tessera::Error naming the variable.
models::ModelConfig modelFromEnv();

// A group of one process on `device`: tensor or pipeline parallelism of size 1. It is
// src/comm/fake's communicator at size 1, which is exact there (every op of one rank is the
// identity) and moves nothing; the model's layers skip their collectives for a group of one.
CommPtr selfGroup(const at::Device& device);

// The chunk `range` of the model (ChunkRange::whole: all of it; train::chunkRange: a pipeline
// stage) over tensor-parallel group `tp` (selfGroup for none), kModelSeed's weights, on the CPU
// (move it with ->to()).
models::LmChunk buildModel(const models::ModelConfig& c, const CommPtr& tp, const models::ChunkRange& range,
                           bool sequenceParallel = false);

// Random tokens and targets, each [batch, T] int64 below the vocabulary, drawn in that order on the
// CPU from a generator seeded `seed` (the same numbers on every machine), then moved to `device`.
std::pair<at::Tensor, at::Tensor> randomBatch(const models::ModelConfig& c, int64_t batch, uint64_t seed,
                                              const at::Device& device);

}  // namespace tessera::bench
