#pragma once
// The decoder-only language models tessera trains (train_gpt --model): the GPT (pre-LayerNorm
// blocks with biases, GELU MLP, learned or rotary positions or none) and the Llama family
// (RMSNorm, rotary positions with optional Llama-3 frequency scaling, grouped-query attention,
// SwiGLU MLP, no biases, optional tied input/output embeddings, optional q/k RMSNorm and an explicit
// head size: Qwen3, OLMoE; sparse layers: Mixtral, Qwen3-MoE, OLMoE). Presets name the shapes people
// train; every dimension can be overridden after the preset. Local; pure data.
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/nn/rope.h"

namespace tessera::models {

enum class Arch { Gpt, Llama };
enum class Positions { None, Learned, Rope };
const char* toString(Arch a);
const char* toString(Positions p);
Positions parsePositions(const std::string& s);  // "none" | "learned" | "rope"

using nn::RopeScaling;

// RMSNorm of the queries and keys before the rotation (Llama block): none; each head over its head
// size with one [hd] weight for all heads (Qwen3, Qwen3-MoE); the whole projection, q over heads·hd
// and k over kv heads·hd (OLMoE).
enum class QkNorm { None, PerHead, Whole };
const char* toString(QkNorm q);
QkNorm parseQkNorm(const std::string& s);  // "none" | "per-head" | "whole"

// Mixture of experts (models/moe.h): in a sparse layer the Llama block's MLP is replaced by
// routed SwiGLU experts (and optional shared ones). experts = 0: a dense model.
enum class RouterScore { Softmax, Sigmoid };
const char* toString(RouterScore s);
RouterScore parseRouterScore(const std::string& s);  // "softmax" | "sigmoid"

struct MoeConfig {
  int64_t experts = 0;    // routed experts (HF num_local_experts / num_experts / n_routed_experts)
  int64_t topK = 2;       // experts per token (num_experts_per_tok)
  int64_t expertFfn = 0;  // each expert's SwiGLU width (moe_intermediate_size); 0: the model's ffn
  int64_t sharedFfn = 0;  // the shared experts' total SwiGLU width, every token through it; 0: none
  RouterScore score = RouterScore::Softmax;  // over all experts (softmax) or each alone (sigmoid)
  bool normTopK = true;      // the k chosen probabilities renormalised to sum to 1 (norm_topk_prob)
  double routedScale = 1.0;  // the routed output's factor (DeepSeek routed_scaling_factor)
  double capacityFactor = 0;  // 0: dropless; else each expert takes at most ceil(f · tokens · k / experts)
  double auxLossCoef = 0;     // load-balancing loss E · Σ_e f_e · P_e per layer (router_aux_loss_coef)
  double zLossCoef = 0;       // router z-loss: mean over tokens of logsumexp(logits)²
  double biasUpdateRate = 0;  // auxiliary-loss-free balancing (selection-only bias); 0: off
  int64_t firstDense = 0;     // the first layers keep a dense MLP (first_k_dense_replace)
  int64_t sparseStep = 1;     // layer l is sparse when (l + 1) % sparseStep == 0 (decoder_sparse_step)
  std::vector<int64_t> denseLayers = {};  // layers that keep a dense MLP all the same (mlp_only_layers)

  bool sparse(int64_t layer) const {
    for (int64_t l : denseLayers) {
      if (l == layer) return false;
    }
    return experts > 0 && layer >= firstDense && (layer + 1) % sparseStep == 0;
  }
};

struct ModelConfig {
  Arch arch = Arch::Gpt;
  int64_t d = 64, layers = 4, heads = 4;
  int64_t kvHeads = 0;  // Llama: key/value heads (grouped-query attention); 0: = heads
  int64_t ffn = 0;      // MLP width; 0: 4 d (GPT), required for Llama presets
  int64_t vocab = 256, seqLen = 32;
  Positions positions = Positions::Learned;
  double ropeTheta = 10000;
  RopeScaling ropeScaling;
  bool tiedEmbeddings = false;  // the head's weight is the embedding table
  double normEps = 1e-5;
  int64_t headSize = 0;  // Llama: each head's width (HF head_dim); 0: d / heads
  QkNorm qkNorm = QkNorm::None;  // Llama only
  MoeConfig moe;  // Llama only

  int64_t kvH() const { return kvHeads > 0 ? kvHeads : heads; }
  int64_t ffnSize() const { return ffn > 0 ? ffn : 4 * d; }
  int64_t headDim() const { return headSize > 0 ? headSize : d / heads; }
  int64_t expertFfn() const { return moe.expertFfn > 0 ? moe.expertFfn : ffnSize(); }
  // One line: architecture, shape and parameter count.
  std::string describe() const;
  // "gpt d 64 layers 4 ...": every field that shapes the parameters, to refuse a checkpoint of
  // another architecture by comparing two of them.
  std::string signature() const;
};

// Presets: GPT "tiny" (CPU tests; vocab 512, so tessera-prep's byte tokenizer's ids fit), "small",
// "735m" (the anchors' GPT-735M, no positions, as the anchor); Llama "llama-tiny" (CPU tests and
// the CPU main job), "llama3-1b" (Llama 3.2 1B: d 2048, 16 layers, 32 heads, 8 kv heads, FFN 8192,
// vocab 128256, tied, rope theta 500000 with Llama-3 scaling x32, seq 2048), "llama3-8b" (Llama 3
// 8B: d 4096, 32 layers, 32 heads, 8 kv heads, FFN 14336, vocab 128256, untied, rope theta
// 500000, seq 8192); "moe-tiny" (CPU tests: llama-tiny's attention, 8 experts of width 64, top 2,
// a shared expert of 64, layer 0 dense); the MoE models as their Hugging Face config.json gives
// them: "olmoe-1b-7b" (OLMoE-1B-7B-0924), "qwen3-30b-a3b" (Qwen3-30B-A3B), "mixtral-8x7b"
// (Mixtral-8x7B-v0.1). Unknown → tessera::Error.
ModelConfig presetConfig(const std::string& name);
std::vector<std::string> presetNames();
// Checks the shape (d divisible by heads, heads by kv heads, a Llama FFN, positions the
// architecture takes, ...); an error names the field and the numbers.
void validate(const ModelConfig& c);

// Parameters of block `layer` (a sparse layer's: every expert's), of the whole model (the tied
// table counted once); the parameters a token multiplies in block `layer` (top-k experts only).
int64_t blockParamCount(const ModelConfig& c, int64_t layer = 0);
int64_t activeBlockParamCount(const ModelConfig& c, int64_t layer);
int64_t paramCount(const ModelConfig& c);
// Training FLOPs per token (forward + backward): 6 x the parameters every token multiplies
// (blocks' active ones, and the head's V x d once, tied or not; not the embedding lookup) + 12 L (H hd) T for the
// attention scores and their use (the anchors' GPT count keeps its 6 N with the embedding, as
// its PyTorch twin counts). GQA's smaller k/v projections and SwiGLU's three matrices enter
// through the block's parameters.
double flopsPerToken(const ModelConfig& c);

}  // namespace tessera::models
