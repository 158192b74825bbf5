// The model families behind makeBlock / makeFinalNorm (block.h): one switch on the
// architecture, so the LM (lm.h) holds one list of blocks whatever the family.
#include <fmt/format.h>

#include "tessera/common/error.h"
#include "tessera/models/block.h"
#include "tessera/models/gpt.h"
#include "tessera/models/llama.h"

namespace tessera::models {

uint64_t blockSeed(uint64_t seed, int64_t layer) { return seed * 1000003ull + 101ull + static_cast<uint64_t>(layer); }
uint64_t headSeed(uint64_t seed) { return seed * 1000003ull + 7ull; }

Block makeBlock(const ModelConfig& c, CommPtr tp, CommPtr kvGroup, int64_t layer, const LayerOptions& o) {
  switch (c.arch) {
    case Arch::Gpt:
      return std::make_shared<GptBlockImpl>(c, std::move(tp), layer, o);
    case Arch::Llama:
      return std::make_shared<LlamaBlockImpl>(c, std::move(tp), std::move(kvGroup), layer, o);
  }
  throw Error(fmt::format("model: no block for architecture {}", static_cast<int>(c.arch)));
}

Layer makeFinalNorm(const ModelConfig& c, CommPtr tp, const LayerOptions& o) {
  switch (c.arch) {
    case Arch::Gpt:
      return std::make_shared<GptFinalNormImpl>(c, std::move(tp), o);
    case Arch::Llama: {
      auto n = std::make_shared<RmsNormImpl>(c.d, c.normEps, std::move(tp), o.sequenceParallel);
      n->fused = o.fusedKernels;
      return n;
    }
  }
  throw Error(fmt::format("model: no final norm for architecture {}", static_cast<int>(c.arch)));
}

CommPtr familyGroup(const ModelConfig& c, const CommPtr& tp) {
  return c.arch == Arch::Llama ? llamaKvGroup(c, tp) : nullptr;
}

}  // namespace tessera::models
