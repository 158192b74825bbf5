#pragma once
// Picking the next token from logits: greedy at temperature 0, else temperature + nucleus
// (top-p) sampling from a CPU generator seeded once, so a seed reproduces the same tokens on any
// machine and on every rank that samples from the same logits. Local.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::models {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax; the lowest id among equal maxima); > 0: softmax(logits / T)
  double topP = 1;         // in (0, 1]: draw from the smallest set of most likely ids whose probability reaches it
  uint64_t seed = 0;
};

// A temperature < 0 or not finite, a top-p outside (0, 1] → tessera::Error naming the value.
void validate(const SamplingOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o);  // validates
  // logits [batch, vocab] (any device and float dtype; read in float64 on the CPU) → ids [batch]
  // int64 CPU, one draw per row from the generator (none at temperature 0). Ties between equal
  // probabilities go to the lower id, so top-p → 0 gives the greedy choice.
  at::Tensor next(const at::Tensor& logits);

 private:
  SamplingOptions o_;
  at::Generator gen_;
};

}  // namespace tessera::models
