#pragma once
// Training samples as Megatron's GPTDataset makes them (local; thread-safe; no communication):
// the documents [firstDoc, endDoc) of a source, shuffled anew each epoch from the seed, are laid
// end to end (an end-of-document token appended to a document that does not end in one, when
// `eodToken` >= 0), and sample k of the epoch is the seqLen + 1 tokens from token k · seqLen
// (neighbours share one token: inputs and shifted targets). Each epoch's samples are visited in
// a seeded pseudo-random order; sample g >= samplesPerEpoch() is in epoch g / samplesPerEpoch(),
// so the data never runs out. Everything is a pure function of (source, documents, options):
// every rank computes the same samples with no communication.
// Memory: the current epoch's document order and offsets (two int64 per document), rebuilt in
// O(documents) when another epoch is asked for (the last two are kept).
// Errors: no documents, or fewer than seqLen + 1 tokens in the range, name the source.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/data/token_source.h"

namespace tessera::data {

struct SampleOptions {
  int64_t seqLen = 0;     // tokens per sample's input (a sample holds seqLen + 1)
  uint64_t seed = 1234;
  int64_t eodToken = -1;  // >= 0: appended to a document that does not end with it
};

class DocumentSamples {
 public:
  DocumentSamples(std::shared_ptr<const TokenSource> src, int64_t firstDoc, int64_t endDoc, SampleOptions o,
                  uint64_t salt = 0);

  int64_t samplesPerEpoch() const { return perEpoch_; }
  int64_t tokensPerEpoch() const { return tokens_; }
  int64_t seqLen() const { return o_.seqLen; }
  const TokenSource& source() const { return *src_; }
  // Writes sample g's seqLen + 1 tokens to `out` (g >= 0).
  void read(int64_t g, int64_t* out) const;
  // Where token j of sample g comes from ("FILE document D position P", or the appended
  // end-of-document token after document D).
  std::string where(int64_t g, int64_t j) const;
  std::string describe() const;

 private:
  struct Epoch {
    int64_t number = -1;
    std::vector<int64_t> order;  // documents in this epoch's order
    std::vector<int64_t> start;  // where each starts in the epoch's token stream, then the total
  };
  std::shared_ptr<const Epoch> epoch(int64_t e) const;
  // Calls f(document, offset, count, appendedEod) for tokens [t, t + n) of epoch `ep`.
  template <typename F>
  void walk(const Epoch& ep, int64_t t, int64_t n, F&& f) const;
  std::pair<const Epoch*, int64_t> locate(int64_t g, std::shared_ptr<const Epoch>& hold) const;

  std::shared_ptr<const TokenSource> src_;
  int64_t first_, end_;
  SampleOptions o_;
  uint64_t salt_;
  std::vector<int64_t> length_;  // per document of the range, the appended token included
  std::vector<uint8_t> addEod_;
  int64_t tokens_ = 0, perEpoch_ = 0;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const Epoch> recent_[2];
};

}  // namespace tessera::data
