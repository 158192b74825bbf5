#pragma once
// A language-model corpus for training: one dataset or a blend of several, split by documents
// into training and validation samples (local; thread-safe; every rank builds the same from the
// same options with no communication). This is what a trainer is given with --data.
//
// Data spec (Megatron's --data-path): "PATH" or "W1 PATH1 W2 PATH2 ..." (weights > 0, normalised)
// or "PATH1 PATH2 ..." (equal weights); PATH as data/token_source.h opens it.
// Split (Megatron's --split): "98,2" or "98,2,0" — shares of each dataset's documents, in order,
// for training, validation and test (test is not read); cut where a document starts. A share
// that is given but holds no document is an error, as is an empty training share.
// A separate validation spec replaces the split's validation share.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/data/blend.h"

namespace tessera::data {

struct DataOptions {
  std::string train;          // data spec
  std::string valid;          // optional data spec for validation (then the split's valid share is unused)
  std::string split = "100";  // training, validation[, test] shares of each dataset's documents
  Format format = Format::Auto;
  int64_t seqLen = 0;
  uint64_t seed = 1234;
  int64_t eodToken = -1;      // appended where a document lacks it; ends documents of token streams
};

struct BlendSpec {
  std::vector<std::string> paths;
  std::vector<double> weights;
};
// Parses a data spec; bad weights or a dangling weight are errors quoting the spec.
BlendSpec parseBlend(const std::string& spec);
// Parses a split into its normalised shares (1 to 3 numbers >= 0, summing to > 0).
std::vector<double> parseSplit(const std::string& split);

class GptData {
 public:
  explicit GptData(const DataOptions& o);

  const Blend& train() const { return *train_; }
  // nullptr when there is no validation data (no split share and no separate spec).
  const Blend* valid() const { return valid_.get(); }
  int64_t seqLen() const { return o_.seqLen; }
  // The training samples' identity: datasets (content fingerprints), weights, the documents
  // the split trains on, seed, sequence length and EOD token; equal exactly when two runs train
  // on the same samples.
  uint64_t fingerprint() const { return fingerprint_; }
  // A line per dataset and split.
  std::string describe() const;

 private:
  DataOptions o_;
  std::unique_ptr<Blend> train_, valid_;
  uint64_t fingerprint_ = 0;
  std::vector<std::string> lines_;
};

}  // namespace tessera::data
