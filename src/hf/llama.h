#pragma once
// The Hugging Face Llama (transformers' LlamaForCausalLM) <-> tessera's Llama, both ways: the
// config.json fields, the tensor names, and filling a layout's pieces from safetensors. Local,
// pure functions over files; no communication. (The one file of src/hf that knows
// models/config.h, which is pure data.)
//
// Config (config.json -> ModelConfig): hidden_size -> d, intermediate_size -> ffn,
// num_hidden_layers -> layers, num_attention_heads -> heads, num_key_value_heads -> kvHeads
// (default: heads), vocab_size -> vocab, rms_norm_eps -> normEps (default 1e-6, as transformers),
// rope_theta -> ropeTheta (default 10000), rope_scaling null or {"rope_type"|"type": "llama3",
// factor, low_freq_factor, high_freq_factor, original_max_position_embeddings} -> ropeScaling
// (transformers 5's rope_parameters is read the same way), tie_word_embeddings -> tiedEmbeddings
// (default false), max_position_embeddings -> seqLen (the context; train_gpt --seq-len sets the
// training length). Refused, naming the field and value: model_type other than "llama",
// attention_bias or mlp_bias true, hidden_act other than "silu", another rope type, head_dim
// other than hidden_size / num_attention_heads, and whatever validate() refuses.
//
// Names: model.embed_tokens.weight <-> emb.weight; model.layers.N.input_layernorm.weight <->
// blocks.N.attn_norm.weight; self_attn.{q,k,v,o}_proj.weight <-> blocks.N.{wq,wk,wv,wo}.weight;
// post_attention_layernorm.weight <-> mlp_norm.weight; mlp.gate_proj <-> w1, mlp.up_proj <-> w3,
// mlp.down_proj <-> w2; model.norm.weight <-> norm.weight; lm_head.weight <-> head.weight (absent
// when tied: the head is emb.weight). Rotary: both use the rotate-half layout (dimensions i and
// i + head_dim/2 of a head rotate together; nn/rope.h), so q_proj/k_proj rows are taken as they
// are, without the permutation Meta's original checkpoints need (tests/hf proves it against a
// reference written with transformers' conventions).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "hf/config.h"
#include "hf/safetensors.h"
#include "models/config.h"

namespace tessera::hf {

// config.json (a ConfigJson, or read from a directory holding it) -> ModelConfig; the errors
// above.
models::ModelConfig llamaConfigFromHf(const ConfigJson& c);
models::ModelConfig readLlamaConfig(const std::string& hfDir);

// ModelConfig -> config.json. `dtype`: "bfloat16" | "float32" (torch_dtype). `base`: the
// imported model's config.json, whose other fields (bos/eos ids, max_position_embeddings, ...)
// are kept; the fields above are overwritten. A GPT (or anything but the Llama) is refused.
ConfigJson llamaConfigToHf(const models::ModelConfig& c, const std::string& dtype,
                           const std::optional<ConfigJson>& base = std::nullopt);

// tessera's unsharded name <-> transformers' name; an unknown name is an error naming it.
std::string hfName(const std::string& tesseraName);
std::string tesseraName(const std::string& hfName);

// The model's tensors (tessera names) in transformers' order: embedding, layer by layer
// (input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down), norm, head (untied).
std::vector<std::string> llamaTensorNames(const models::ModelConfig& c);
std::vector<int64_t> llamaTensorShape(const models::ModelConfig& c, const std::string& tesseraName);

// Checks that `ck` holds exactly the model's tensors, with their shapes and a float dtype
// (F32, F16, BF16, F64); ignored: rotary inv_freq buffers, and lm_head.weight of a tied model
// (transformers drops it on save, some writers keep it). An error lists the missing and the
// unexpected tensors (a bias is named as such: tessera's Llama has none).
void checkLlamaTensors(const SafetensorsCheckpoint& ck, const models::ModelConfig& c);

// Fills each piece (tessera name, box in the unsharded tensor: LmChunkImpl::pieces()) from the
// slice of its transformers tensor (only those bytes are read from the mapped files), converted
// to the piece's dtype. Errors name the tensor, its file and the box.
void fillLlamaPieces(const SafetensorsCheckpoint& ck, std::vector<checkpoint::Piece>& pieces);

}  // namespace tessera::hf
