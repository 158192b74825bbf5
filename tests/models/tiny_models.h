#pragma once
// Small deterministic models for tests (DDP, FSDP, ...): a tiny MLP and a tiny GPT on
// LibTorch's C++ torch::nn, so they build against LibTorch 1.13 (CPU) and 2.x alike.
//
// Contract:
// - make*(seed, ...) seeds torch's global generator with `seed` and then constructs the model:
//   the same seed gives bit-identical parameters in any process (same LibTorch build). It
//   changes the global generator's state (tests that care re-seed afterwards).
// - *Batch(seed, rank, batch, ...) builds rank `rank`'s batch from its own CPU generator
//   (the global one is untouched), so a test can build rank r's batch on rank r and the
//   concatenation of every rank's batch (concat*Batches) for the single-process reference.
//   Tensors are made on the CPU and then moved to `device`.
// - namedParameters()/namedBuffers() give the (name, tensor) lists that
//   tessera::DistributedDataParallel takes, in registration order.
// Everything here is local (no communication) and not thread-safe across one model.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <functional>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::testing {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

NamedTensors namedParameters(const torch::nn::Module& m);
NamedTensors namedBuffers(const torch::nn::Module& m);

// ---- TinyMlp: fc1 (in -> hidden), ReLU, fc2 (hidden -> hidden), ReLU, fc3 (hidden -> out).
struct TinyMlpOptions {
  int64_t in = 8, hidden = 32, out = 4;
};

struct TinyMlpImpl : torch::nn::Module {
  explicit TinyMlpImpl(const TinyMlpOptions& o = {});
  // [B, in] -> [B, out]. With skipFc2, fc2 is not used: its parameters get no gradient
  // (the unused-parameter case); the flag may change between iterations.
  torch::Tensor forward(const torch::Tensor& x);

  TinyMlpOptions opts;
  bool skipFc2 = false;
  // How the linears run (x, weight, bias) -> y; unset: torch::nn::Linear::forward. A test sets it
  // to another implementation (e.g. tessera's nn::linearAccumulateGrad) to check it in training.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)> linearFn;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(TinyMlp);

TinyMlp makeTinyMlp(uint64_t seed, const TinyMlpOptions& o = {});

struct MlpBatch {
  torch::Tensor x;  // [B, in] float32
  torch::Tensor y;  // [B, out] float32 regression target
};
MlpBatch mlpBatch(uint64_t seed, int rank, int64_t batch, const TinyMlpOptions& o = {},
                  const torch::Device& device = torch::kCPU);
// Ranks 0..worldSize-1's batches concatenated along dim 0 (rank order).
MlpBatch concatMlpBatches(uint64_t seed, int worldSize, int64_t batch, const TinyMlpOptions& o = {},
                          const torch::Device& device = torch::kCPU);
// Mean squared error: the loss the DDP tests average (a mean over the batch, so the
// average over ranks of per-rank gradients equals the gradient on the concatenated batch).
torch::Tensor mlpLoss(const torch::Tensor& out, const torch::Tensor& y);

// ---- TinyGpt: token embedding + learned positions, `layers` pre-LayerNorm blocks
// (causal self-attention with plain ops, MLP 4*d with GELU), final LayerNorm, untied head.
struct TinyGptOptions {
  int64_t vocab = 64, d = 32, layers = 2, heads = 4, seqLen = 16;
};

// dropout > 0: hidden dropout on the attention and MLP outputs before the residual adds, in
// training mode, with the masks of tessera::tp::ParallelBlock (src/parallel/tensor/blocks.h),
// re-implemented here (this library does not link tessera), so that a change of either side's
// masks fails test_tp_blocks: the k-th masked forward seeds a fresh generator of x's device with
// dropoutSeed + k·0x9E3779B97F4A7C15 and draws bernoulli(1 − p) over [T, B, d] (tokens first, as
// ParallelBlock lays them out), the attention output's mask then the MLP output's, each scaled
// by 1 / (1 − p). dropout = 0 (the default) or eval mode: no dropout, nothing drawn.
struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t d, int64_t heads, double dropout = 0, uint64_t dropoutSeed = 0);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  int64_t heads;
  double dropout;
  uint64_t dropoutSeed;
  int64_t dropoutCalls = 0;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(GptBlock);

struct TinyGptImpl : torch::nn::Module {
  explicit TinyGptImpl(const TinyGptOptions& o = {});
  // tokens [B, T] int64 (T <= seqLen) -> logits [B, T, vocab] float32.
  torch::Tensor forward(const torch::Tensor& tokens);

  TinyGptOptions opts;
  torch::nn::Embedding tok{nullptr};
  torch::Tensor pos;  // [seqLen, d] learned positions
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyGpt);

TinyGpt makeTinyGpt(uint64_t seed, const TinyGptOptions& o = {});

struct GptBatch {
  torch::Tensor tokens;   // [B, seqLen] int64 in [0, vocab)
  torch::Tensor targets;  // [B, seqLen] int64 in [0, vocab)
};
GptBatch gptBatch(uint64_t seed, int rank, int64_t batch, const TinyGptOptions& o = {},
                  const torch::Device& device = torch::kCPU);
GptBatch concatGptBatches(uint64_t seed, int worldSize, int64_t batch, const TinyGptOptions& o = {},
                          const torch::Device& device = torch::kCPU);
// Mean cross-entropy over all B*T positions; logits are cast to float32 first.
torch::Tensor gptLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace tessera::testing
