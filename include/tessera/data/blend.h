#pragma once
// A weighted blend of sample streams, as Megatron's BlendedDataset (local; thread-safe):
// sample g of the blend is the next unused sample of the part whose share so far lags its
// weight the most (part j maximising w_j · max(g, 1) − taken_j; the first on ties), so every
// prefix of the blend holds each part within one sample of its weight. Deterministic; no
// communication. Seeking to g replays at most 8192 choices from a kept mark.
// A blend of one part is that part.
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tessera/data/samples.h"

namespace tessera::data {

class Blend {
 public:
  // Weights > 0 (normalised here), one per part; parts share one sequence length.
  Blend(std::vector<std::shared_ptr<const DocumentSamples>> parts, std::vector<double> weights);

  int64_t seqLen() const { return parts_.front()->seqLen(); }
  size_t numParts() const { return parts_.size(); }
  const DocumentSamples& part(size_t j) const { return *parts_[j]; }
  double weight(size_t j) const { return weights_[j]; }
  // (part, that part's sample) for each of samples [first, first + n).
  std::vector<std::pair<int, int64_t>> locate(int64_t first, int64_t n) const;
  // Samples [first, first + n) into `out`, n · (seqLen + 1) tokens, row by row.
  void read(int64_t first, int64_t n, int64_t* out) const;
  // Where token j of sample g comes from (data/samples.h).
  std::string where(int64_t g, int64_t j) const;

 private:
  static constexpr int64_t kMark = 8192;
  int choose(int64_t g, const std::vector<int64_t>& taken) const;
  std::vector<std::shared_ptr<const DocumentSamples>> parts_;
  std::vector<double> weights_;
  mutable std::mutex mu_;
  mutable std::vector<std::vector<int64_t>> marks_;  // marks_[m]: samples taken per part before m · kMark
};

}  // namespace tessera::data
