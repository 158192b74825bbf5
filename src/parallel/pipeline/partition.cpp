#include "tessera/parallel/pipeline/partition.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "tessera/common/error.h"

namespace tessera::pipeline {

std::string Partition::describe() const {
  std::string out;
  for (int s = 0; s < numStages(); ++s)
    out += fmt::format("{}stage {}: blocks [{}, {}) {} params", s ? "; " : "", s, bounds[s], bounds[s + 1], params[s]);
  return out;
}

Partition partitionBlocks(const std::vector<int64_t>& blockParams, const PartitionOptions& o) {
  TESSERA_CHECK(o.pp >= 1 && o.chunks >= 1, "pipeline partition: pp = {}, chunks = {} (each must be >= 1)", o.pp,
                o.chunks);
  const int n = static_cast<int>(blockParams.size());
  const int S = o.pp * o.chunks;
  Partition p;
  p.pp = o.pp;
  p.chunks = o.chunks;
  p.vShape = o.vShape;
  if (!o.layersPerStage.empty()) {
    TESSERA_CHECK(static_cast<int>(o.layersPerStage.size()) == S,
                  "pipeline partition: layers per stage [{}] has {} entries, but pp {} x {} chunks = {} stages",
                  fmt::join(o.layersPerStage, ", "), o.layersPerStage.size(), o.pp, o.chunks, S);
    int sum = 0;
    for (int s = 0; s < S; ++s) {
      TESSERA_CHECK(o.layersPerStage[s] >= 1, "pipeline partition: layers per stage [{}]: stage {} has {} blocks (each needs >= 1)",
                    fmt::join(o.layersPerStage, ", "), s, o.layersPerStage[s]);
      sum += o.layersPerStage[s];
    }
    TESSERA_CHECK(sum == n, "pipeline partition: layers per stage [{}] sum to {}, but the model has {} blocks",
                  fmt::join(o.layersPerStage, ", "), sum, n);
    p.bounds.push_back(0);
    for (int s = 0; s < S; ++s) p.bounds.push_back(p.bounds.back() + o.layersPerStage[s]);
  } else {
    TESSERA_CHECK(n >= S,
                  "pipeline partition: cannot split {} blocks into {} stages (pp {} x {} chunks): every stage needs at "
                  "least one block",
                  n, S, o.pp, o.chunks);
    // best[s][j]: the smallest possible largest-stage cost putting blocks [0, j) on stages [0, s).
    std::vector<int64_t> prefix(n + 1, 0);
    for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + blockParams[i];
    const int64_t embeddingCost = o.embeddingIsLookup ? 0 : o.embeddingParams;
    auto cost = [&](int s, int i, int j) {
      return prefix[j] - prefix[i] + (s == 0 ? embeddingCost : 0) + (s == S - 1 ? o.headParams : 0);
    };
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(S + 1, std::vector<int64_t>(n + 1, inf));
    std::vector<std::vector<int>> cut(S + 1, std::vector<int>(n + 1, 0));
    best[0][0] = 0;
    for (int s = 1; s <= S; ++s)
      for (int j = s; j <= n - (S - s); ++j)
        for (int i = s - 1; i < j; ++i) {
          if (best[s - 1][i] == inf) continue;
          int64_t c = std::max(best[s - 1][i], cost(s - 1, i, j));
          if (c < best[s][j]) best[s][j] = c, cut[s][j] = i;
        }
    p.bounds.assign(S + 1, n);
    for (int s = S; s > 0; --s) p.bounds[s - 1] = cut[s][p.bounds[s]];
  }
  for (int s = 0; s < S; ++s) {
    int64_t c = std::accumulate(blockParams.begin() + p.bounds[s], blockParams.begin() + p.bounds[s + 1], int64_t{0});
    p.params.push_back(c + (s == 0 ? o.embeddingParams : 0) + (s == S - 1 ? o.headParams : 0));
  }
  return p;
}

namespace {
int64_t countParams(const torch::nn::AnyModule& m) {
  if (m.is_empty()) return 0;
  int64_t n = 0;
  for (const auto& t : m.ptr()->parameters()) n += t.numel();
  return n;
}
void addParams(const torch::nn::AnyModule& m, std::vector<at::Tensor>& out) {
  if (m.is_empty()) return;
  for (const auto& t : m.ptr()->parameters()) out.push_back(t);
}
}  // namespace

Partition partitionModel(const SequentialModel& model, PartitionOptions o) {
  std::vector<int64_t> counts;
  for (const auto& b : model.blocks) counts.push_back(countParams(b));
  o.embeddingParams = countParams(model.embedding);
  o.headParams = countParams(model.head);
  return partitionBlocks(counts, o);
}

StageModule buildStage(const SequentialModel& model, const Partition& part, int stage) {
  TESSERA_CHECK(stage >= 0 && stage < part.numStages(), "pipeline partition: stage {} out of range [0, {})", stage,
                part.numStages());
  TESSERA_CHECK(part.bounds.back() == static_cast<int>(model.blocks.size()),
                "pipeline partition covers {} blocks, the model has {}", part.bounds.back(), model.blocks.size());
  std::vector<torch::nn::AnyModule> mods;
  if (stage == 0 && !model.embedding.is_empty()) mods.push_back(model.embedding);
  for (int i = part.firstBlock(stage); i < part.endBlock(stage); ++i) mods.push_back(model.blocks[i]);
  if (stage == part.numStages() - 1 && !model.head.is_empty()) mods.push_back(model.head);
  StageModule sm;
  for (const auto& m : mods) addParams(m, sm.parameters);
  sm.forward = [mods](const at::Tensor& x) mutable {
    at::Tensor y = x;
    for (auto& m : mods) y = m.forward(y);
    return y;
  };
  return sm;
}

}  // namespace tessera::pipeline
