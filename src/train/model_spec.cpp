#include "tessera/train/model_spec.h"

namespace tessera::train {

const ModelSpec& modelSpec(models::Arch arch) {
  static const ModelSpec gpt{"gpt", false}, llama{"llama", true};
  return arch == models::Arch::Llama ? llama : gpt;
}

pipeline::Partition partitionModel(const models::ModelConfig& c, int pp, int chunks,
                                   const std::vector<int>& layersPerStage, bool vShape) {
  pipeline::PartitionOptions o;
  o.vShape = vShape;
  o.pp = pp;
  o.chunks = chunks;
  o.layersPerStage = layersPerStage;
  o.embeddingParams = c.vocab * c.d;
  o.headParams = c.vocab * c.d + 2 * c.d;
  o.embeddingIsLookup = true;
  std::vector<int64_t> cost;  // what a token multiplies in each block: a sparse layer's top-k experts
  for (int64_t l = 0; l < c.layers; ++l) cost.push_back(models::activeBlockParamCount(c, l));
  return pipeline::partitionBlocks(cost, o);
}

models::ChunkRange chunkRange(const pipeline::Partition& part, int stage) {
  return {stage, part.numStages(), part.firstBlock(stage), part.endBlock(stage)};
}

// The head runs last in forward and first in backward: kept gathered in between rather than
// gathered again (its 1 GB all-gather on llama3-8b waited in front of backward).
bool keepGathered(const ModelPart& part) { return part.name == "head"; }

}  // namespace tessera::train
