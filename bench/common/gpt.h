#pragma once
// The GPT-735M of ../shared/anchors/torch_anchor.py in LibTorch C++, shared by the benchmarks:
// token embedding (no positions, as the anchor), `layers` pre-LayerNorm blocks (qkv Linear,
// causal attention (common/attention.h) over heads of d/heads, proj; MLP 4*d with GELU),
// final LayerNorm, untied head without bias. Parameter count and FLOPs as the anchor:
//   N = L*(12 d^2 + 13 d) + 2 V d + 2 d;  FLOPs/token = 6 N + 12 L d T.
// Also the pieces of the anchor's training step: bf16 autocast for the forward (fp32
// parameters) and AdamW through ATen's fused CUDA kernel (at::_fused_adamw_).
// The benchmarks' numbers come from CUDA LibTorch 2.x. With LibTorch 1.13 (the CPU machine)
// the same code builds for a smoke run on the CPU: Bf16Autocast does nothing there and
// FusedAdamW steps with ordinary tensor ops (same update).
// Everything here is local to one process and one device; not thread-safe.
#include <torch/torch.h>

#include "common/autocast.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tessera::bench {

struct GptConfig {
  int64_t d = 2048, layers = 12, heads = 16, vocab = 32000, seqLen = 1024;
};

int64_t gptParamCount(const GptConfig& c);
double gptFlopsPerToken(const GptConfig& c);

struct BenchBlockImpl : torch::nn::Module {
  BenchBlockImpl(int64_t d, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

  int64_t heads;
  // The linears through nn::linearAccumulateGrad (src/nn/accum_linear.h: weight gradients summed
  // in fp32 by the GEMM into .grad, for micro-batches) instead of at::linear. Not under FSDP.
  bool accumulateGrad = false;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(BenchBlock);

struct BenchGptImpl : torch::nn::Module {
  explicit BenchGptImpl(const GptConfig& c = {});
  // tokens [B, T] int64 -> logits [B, T, vocab] (bf16 under autocast).
  torch::Tensor forward(const torch::Tensor& tokens);

  // Every linear (blocks and head) through nn::linearAccumulateGrad (BenchBlockImpl::accumulateGrad).
  void setAccumulateGrad(bool on);

  GptConfig cfg;
  bool accumulateGrad = false;  // the head's; the blocks have their own
  torch::nn::Embedding emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BenchGpt);

// x W^T + b through at::linear, as Python's nn.Linear calls it. torch::nn::Linear::forward (the
// C++ frontend's F::linear) computes a 3-D input as matmul, then `+= bias` as a separate kernel:
// under bf16 autocast an in-place bf16 += fp32 add that took 8 of the C++ model's 85 ms per step
// on an H200 (bench/profile, 2026-11-23), where at::linear folds the bias into the GEMM.
// accumulateGrad: nn::linearAccumulateGrad instead (see BenchBlockImpl::accumulateGrad).
torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x, bool accumulateGrad = false);

// Mean cross-entropy over B*T positions, logits cast to fp32 first (as the anchor).
torch::Tensor gptLoss(const torch::Tensor& logits, const torch::Tensor& targets);

// bf16 autocast for the forward (src/common/autocast.h).
using Bf16Autocast = tessera::Bf16Autocast;

// AdamW (decoupled weight decay) as torch.optim.AdamW(fused=True): one at::_fused_adamw_ call
// over every parameter with a gradient. State (exp_avg, exp_avg_sq, float32 step on the
// device, incremented before the kernel) is allocated at the first step(), as PyTorch does.
class FusedAdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, double lr = 1e-4, double beta1 = 0.9, double beta2 = 0.999,
             double eps = 1e-8, double weightDecay = 1e-2);
  void step();
  // Only `subset` (some of the constructor's parameters, by identity): DDP's onBucketReduced.
  void step(const std::vector<torch::Tensor>& subset);
  // setToNone: .grad reset (freed); else zeroed in place (keeps DDP bucket views).
  void zeroGrad(bool setToNone);

 private:
  void stepIndices(const std::vector<size_t>& which);
  std::vector<torch::Tensor> params_, expAvg_, expAvgSq_, steps_;
  std::unordered_map<const void*, size_t> index_;
  double lr_, beta1_, beta2_, eps_, wd_;
};

}  // namespace tessera::bench
