#pragma once
// Batches for data-parallel training (local; no communication) and the data position a
// checkpoint keeps.
//
// Step s's global batch of B sequences is samples [s · B, (s + 1) · B) of the training blend,
// so it depends on nothing but the data options and s: data-parallel rank r of dp reads rows
// [r · B / dp, (r + 1) · B / dp), and dp 1, 2 or 4 train on the same global batches, a resumed
// run continues where the interrupted one was, and a run resumed under another dp continues
// the same sequence. A position in samples (not steps) survives a change of B.
#include <ATen/core/Tensor.h>

#include <string>

#include "tessera/data/blend.h"

namespace tessera::data {

struct TokenBatch {
  at::Tensor tokens, targets;  // [rows, seqLen] int64: inputs and the next tokens
};

// Samples [first, first + rows) as a [rows, seqLen + 1] int64 tensor written into `into` (CPU,
// that shape, e.g. pinned memory) or a new one. Every token must be in [0, vocab) (vocab > 0):
// otherwise a tessera::Error naming the token, the file, document and position.
at::Tensor readSamples(const Blend& b, int64_t first, int64_t rows, int64_t vocab, at::Tensor into = {});

// Inputs and targets (views) of a [rows, seqLen + 1] sample tensor.
TokenBatch splitSamples(const at::Tensor& samples);

// The data position a checkpoint keeps: samples consumed and the training data's identity.
struct DataState {
  int64_t consumedSamples = 0;
  uint64_t fingerprint = 0;
  std::string description;  // what the data was, for the error when it differs
};
std::string encodeDataState(const DataState& s);
// Parses encodeDataState's text; malformed text is an error naming it.
DataState decodeDataState(const std::string& text);
// The state a resumed run must continue from: an error when `saved` is of other data than
// `current` (naming both descriptions), else saved's position.
int64_t resumePosition(const DataState& saved, const DataState& current);

}  // namespace tessera::data
