// The benchmarks' model (contract in bench_model.h).
#include "bench_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "comm/fake/fake_communicator.h"
#include "timing.h"

namespace tessera::bench {

models::ModelConfig modelFromEnv() {
  auto c = models::presetConfig("735m");
  c.d = envInt("D", c.d);
  c.layers = envInt("L", c.layers);
  c.heads = std::max<int64_t>(1, c.d / 128);
  c.vocab = envInt("V", c.vocab);
  c.seqLen = envInt("T", c.seqLen);
  models::validate(c);
  return c;
}

CommPtr selfGroup(const at::Device& device) { return makeFakeCommunicator(0, 1, device, "self"); }

models::LmChunk buildModel(const models::ModelConfig& c, const CommPtr& tp, const models::ChunkRange& range,
                           bool sequenceParallel) {
  models::LayerOptions o;
  o.sequenceParallel = sequenceParallel;
  o.seed = kModelSeed;
  return models::LmChunk(c, tp, /*kvGroup=*/nullptr, range, o);
}

std::pair<at::Tensor, at::Tensor> randomBatch(const models::ModelConfig& c, int64_t batch, uint64_t seed,
                                              const at::Device& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = at::randint(0, c.vocab, {batch, c.seqLen}, gen, at::kLong);
  auto y = at::randint(0, c.vocab, {batch, c.seqLen}, gen, at::kLong);
  return {x.to(device), y.to(device)};
}

}  // namespace tessera::bench
