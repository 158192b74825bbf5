#pragma once
// The Hugging Face families of tessera's Llama block: LlamaForCausalLM ("llama"), Qwen3ForCausalLM
// ("qwen3": per-head q/k norm, head_dim), MixtralForCausalLM ("mixtral": every layer sparse, top-k
// renormalised), Qwen3MoeForCausalLM ("qwen3_moe": per-head q/k norm, moe_intermediate_size,
// decoder_sparse_step, mlp_only_layers) and OlmoeForCausalLM ("olmoe": q/k norm over the whole
// projection). What each config.json field means for a ModelConfig, both ways, and every tensor's
// HF name(s): an expert tensor [E, f, d] is E HF tensors (experts.e.*), the router's selection bias
// none. Unsupported fields are refused by name. Local, pure. docs/design/hf.md: the table.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hf/config.h"
#include "tessera/models/config.h"

namespace tessera::hf {

enum class Family { Llama, Qwen3, Mixtral, Qwen3Moe, Olmoe };
const char* modelType(Family f);     // "llama", "qwen3", "mixtral", "qwen3_moe", "olmoe"
const char* architecture(Family f);  // "LlamaForCausalLM", ...
// config.json's model_type (default "llama"); any other is refused naming the five.
Family familyOfConfig(const ConfigJson& c);
// The family a ModelConfig exports as; a model no family holds is refused naming the field
// (a sigmoid router, shared experts, the selection bias, a capacity, dense layers in Mixtral, ...).
Family familyOf(const models::ModelConfig& c);

// The family's fields of config.json (experts, q/k norm, head_dim, sliding windows, ...) into `m`,
// whose shared Llama fields are read already; refusals name the field.
void readFamilyFields(const ConfigJson& c, Family f, models::ModelConfig& m);
// The family's fields into config.json `o` (the shared Llama fields are written by the caller).
void writeFamilyFields(const models::ModelConfig& c, Family f, nlohmann::json& o);

// One tensor of tessera's model (its unsharded name and shape) and its HF tensors: one; one per
// expert (slices of dim 0, named in expert order); none (the router's selection bias: zero).
struct TensorMap {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> hf;
};
// Every tensor in export order: embedding, layer by layer, norm, head (untied).
std::vector<TensorMap> tensorMap(const models::ModelConfig& c);

}  // namespace tessera::hf
