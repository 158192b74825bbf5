#pragma once
// tessera_generate's command line (see tessera_generate.cpp). Every flag is --name value or
// --name=value; --help prints them. Unknown flags and bad values are tessera::Error naming the
// flag and the value.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/models/config.h"
#include "tessera/models/generate.h"

namespace tessera::generate {

struct GenerateCli {
  std::string modelDir;
  std::vector<std::vector<int64_t>> prompts;  // --prompt-ids, once per prompt
  models::GenerateOptions gen;                // --max-new-tokens, --temperature, --top-p, --seed, --eos-id
  int tp = 0;                                 // 0: the world size
  // --model PRESET and the shape flags (as train_gpt's): for checkpoints without a model config.
  std::optional<models::ModelConfig> model;
  // --logits-out FILE: rank 0 writes each prompt's step logits as tensor "prompt.<k>" [new tokens,
  // vocab] (float32) of a safetensors file, for comparisons with other implementations.
  std::string logitsOut;
  bool help = false;
};

GenerateCli parseCli(int argc, char** argv);
std::string usage();

}  // namespace tessera::generate
