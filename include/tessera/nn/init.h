#pragma once
// Seeded initial weights, drawn fast and the same in every layout.
//
// seededNormal(rows, cols, mean, std, seed): a float32 CPU tensor [rows, cols] of N(mean, std²)
// draws, filled in blocks of rows (about 2^20 values each), block b from its own CPU generator
// seeded by (seed, b). The values depend only on the shape, mean, std and seed: not on the thread
// count, the machine or the tensor-parallel layout (callers draw the unsharded tensor and keep
// their shard, as the models do). Blocks are filled by up to 16 threads at once, so a llama3-8b
// rank draws its 8 B initial values in seconds rather than in a minute and a half of one core.
// Local; rows, cols >= 0 (else a tessera::Error naming them).
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::nn {

at::Tensor seededNormal(int64_t rows, int64_t cols, double mean, double std, uint64_t seed);

}  // namespace tessera::nn
