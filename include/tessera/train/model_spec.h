#pragma once
// What the trainer knows of a model family beyond the model itself (torchtitan's TrainSpec): how
// its blocks split into pipeline stages, which of its parts FSDP keeps gathered, and whether
// Hugging Face directories can be read and written for it. One spec per architecture. Local, pure.
#include <string>
#include <vector>

#include "tessera/models/lm.h"
#include "tessera/parallel/param.h"
#include "tessera/parallel/pipeline/partition.h"

namespace tessera::train {

struct ModelSpec {
  std::string name;  // "gpt" | "llama"
  bool huggingFace = false;  // hf/llama.h reads and writes its directories
};
const ModelSpec& modelSpec(models::Arch arch);

// The blocks of `c` over pp · chunks stages, balanced by compute (the embedding is a lookup, the
// head counts as a GEMM) unless layersPerStage is given; vShape: ZB-V's placement of the stages.
// Errors name the numbers.
pipeline::Partition partitionModel(const models::ModelConfig& c, int pp, int chunks,
                                   const std::vector<int>& layersPerStage, bool vShape = false);
// Stage `stage` of `part` as the model takes it.
models::ChunkRange chunkRange(const pipeline::Partition& part, int stage);
// FSDP's unit policy: the head stays gathered from its forward (last) to its backward (first), as
// FSDP2 keeps its root.
bool keepGathered(const ModelPart& part);

}  // namespace tessera::train
