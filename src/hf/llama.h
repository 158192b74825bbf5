#pragma once
// Hugging Face models of the Llama block (Llama, Qwen3, Mixtral, Qwen3-MoE, OLMoE: hf/families.h)
// <-> tessera's Llama, both ways: the config.json fields, the tensor names, and filling a layout's
// pieces from safetensors. Local, pure functions over files; no communication.
// Names (each with .weight): model.embed_tokens <-> emb; model.layers.N.input_layernorm <->
// blocks.N.attn_norm; self_attn.{q,k,v,o}_proj <-> {wq,wk,wv,wo}; self_attn.{q,k}_norm <->
// {q,k}_norm; post_attention_layernorm <-> mlp_norm; mlp.{gate,up,down}_proj <-> w1, w3, w2;
// experts: families.h; model.norm <-> norm; lm_head <-> head (absent when tied). q_proj and k_proj
// rows are taken as they are (rotate-half). Errors: tessera::Error naming the field and value, or
// the tensor, its file and the box. The config table and the refusals: docs/design/hf.md.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "hf/config.h"
#include "tessera/hf/safetensors.h"
#include "tessera/models/config.h"

namespace tessera::hf {

// config.json (a ConfigJson, or read from a directory holding it) -> ModelConfig (the fields and
// defaults: docs/design/hf.md). Refused, naming the field and value: a model_type other than the
// five families', attention or MLP biases, hidden_act other than "silu", a rope type other than
// llama3, sliding windows, latent attention, and what validate() refuses.
models::ModelConfig llamaConfigFromHf(const ConfigJson& c);
models::ModelConfig readLlamaConfig(const std::string& hfDir);

// ModelConfig -> config.json. `dtype`: "bfloat16" | "float32" (torch_dtype). `base`: the
// imported model's config.json, whose other fields (bos/eos ids, max_position_embeddings, ...)
// are kept; the fields tessera maps are overwritten. The family is familyOf(c)'s: a model no family
// holds (a GPT, a sigmoid router, shared experts, ...) is refused naming the field.
ConfigJson llamaConfigToHf(const models::ModelConfig& c, const std::string& dtype,
                           const std::optional<ConfigJson>& base = std::nullopt);

// tessera's unsharded name <-> transformers' name; an unknown name is an error naming it.
std::string hfName(const std::string& tesseraName);
std::string tesseraName(const std::string& hfName);

// The model's tensors (tessera names; tensorMap's): embedding, layer by layer (input_layernorm, q,
// k, v, o, q/k norms, post_attention_layernorm, gate, up, down or the router, its bias and the
// experts), norm, head (untied).
std::vector<std::string> llamaTensorNames(const models::ModelConfig& c);
std::vector<int64_t> llamaTensorShape(const models::ModelConfig& c, const std::string& tesseraName);

// Checks that `ck` holds exactly the model's tensors, with their shapes and a float dtype
// (F32, F16, BF16, F64); ignored: rotary inv_freq buffers, and lm_head.weight of a tied model
// (transformers drops it on save, some writers keep it). An error lists the missing and the
// unexpected tensors (a bias is named as such: tessera's Llama has none).
void checkLlamaTensors(const SafetensorsCheckpoint& ck, const models::ModelConfig& c);

// Fills each piece of a model of config `c` (tessera name, box in the unsharded tensor:
// LmChunkImpl::pieces()) from the slice of its transformers tensor(s) (only those bytes are read
// from the mapped files; an expert box from each expert's tensor), converted to the piece's dtype;
// the router's selection bias with zeros. Errors name the tensor, its file and the box.
void fillLlamaPieces(const SafetensorsCheckpoint& ck, const models::ModelConfig& c,
                     std::vector<checkpoint::Piece>& pieces);

}  // namespace tessera::hf
