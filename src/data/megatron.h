#pragma once
// Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx, data/formats.h), memory-mapped and
// read in place (local; thread-safe). Sequences are what Megatron's GPTDataset packs, so they
// are this source's documents; Megatron's documents (ranges of sequences, documentIndices())
// are where a split may cut. Construction validates the whole index (O(sequences)).
#include <ATen/core/Tensor.h>

#include "data/mapped_file.h"
#include "tessera/data/token_source.h"

namespace tessera::data {

class IndexedDataset : public TokenSource {
 public:
  // `prefix`: PREFIX, PREFIX.idx or PREFIX.bin.
  explicit IndexedDataset(const std::string& prefix);

  int64_t numSequences() const { return index_.sequences; }
  int64_t sequenceLength(int64_t i) const;
  // Sequence i's tokens as a new int64 CPU tensor.
  at::Tensor sequence(int64_t i) const;
  // Megatron's document indices (int64 CPU tensor of D entries, 0 first, S last).
  at::Tensor documentIndices() const;
  std::string binPath() const { return bin_.path(); }
  std::string idxPath() const { return idx_.path(); }

  int64_t numDocuments() const override { return index_.sequences; }
  int64_t documentLength(int64_t doc) const override { return sequenceLength(doc); }
  void read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const override;
  std::vector<int64_t> splitPoints() const override;
  std::string where(int64_t doc, int64_t offset) const override;
  int64_t numTokens() const override { return tokens_; }
  TokenType tokenType() const override { return index_.type; }
  std::string describe() const override;
  uint64_t fingerprint() const override;

 private:
  MappedFile idx_, bin_;
  MegatronIndex index_;
  int64_t tokens_ = 0;
};

// PREFIX from PREFIX, PREFIX.idx or PREFIX.bin.
std::string megatronPrefix(const std::string& path);

}  // namespace tessera::data
