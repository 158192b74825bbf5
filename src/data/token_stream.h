#pragma once
// One token stream from several files read back to back (local; thread-safe): llm.c shards
// (a glob, in sorted order, each header checked) or raw token files (nanoGPT's train.bin; the
// token type is the caller's). Documents: the stream cut after every end-of-document token when
// one is given (a document may span two files, as llm.c's shards split them), else the whole
// stream is one document. Finding the documents reads the stream once (O(tokens)).
#include <ATen/core/Tensor.h>

#include "data/mapped_file.h"
#include "tessera/data/token_source.h"

namespace tessera::data {

// The files `pattern` names (a path or a glob), sorted; none is an error naming the pattern.
std::vector<std::string> globFiles(const std::string& pattern);

class TokenStream : public TokenSource {
 public:
  // `pattern`: a file or a glob. `format`: Llmc, RawUInt16 or RawUInt32.
  TokenStream(const std::string& pattern, Format format, int64_t eodToken = -1);

  const std::vector<std::string>& files() const { return names_; }
  // Tokens [start, start + count) of the whole stream as a new int64 CPU tensor.
  at::Tensor tokens(int64_t start, int64_t count) const;

  int64_t numDocuments() const override { return static_cast<int64_t>(docStart_.size()) - 1; }
  int64_t documentLength(int64_t doc) const override;
  void read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const override;
  std::vector<int64_t> splitPoints() const override;
  std::string where(int64_t doc, int64_t offset) const override;
  int64_t numTokens() const override { return fileStart_.back(); }
  TokenType tokenType() const override { return type_; }
  std::string describe() const override;
  uint64_t fingerprint() const override;

 private:
  void readStream(int64_t start, int64_t count, int64_t* out) const;
  size_t fileOf(int64_t token) const;
  Format format_;
  TokenType type_ = TokenType::UInt16;
  int64_t eod_;
  std::vector<std::string> names_;
  std::vector<MappedFile> files_;
  std::vector<size_t> header_;       // bytes before each file's tokens
  std::vector<int64_t> fileStart_;   // first stream token of each file, then the total
  std::vector<int64_t> docStart_;    // first stream token of each document, then the total
};

}  // namespace tessera::data
