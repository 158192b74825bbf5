#pragma once
// Synthetic training data (train_gpt --data synthetic): learnable token streams, a pure function of
// (seed, step), so every layout sees the same global batch and a resumed run the same data as an uninterrupted
// one (the data position is the step). Sequence n of a step is an arithmetic progression
// modulo the vocabulary (start uniform in [0, V), stride uniform in [1, 8]); inputs are its
// first T tokens, targets the next T. Local (no communication).
#include <ATen/ATen.h>

#include <cstdint>

#include "tessera/data/batch.h"

namespace tessera::data {

// Rows [first, first + rows) of step `step`'s global batch of `globalBatch` sequences.
// Tokens and targets [rows, T] int64 on `device`.
TokenBatch syntheticRows(uint64_t seed, int64_t step, int64_t globalBatch, int64_t first, int64_t rows, int64_t vocab,
                int64_t seqLen, at::Device device);

}  // namespace tessera::data
