#pragma once
// A tokenized corpus as a list of documents, read through memory mappings (local; every method
// is safe to call from several threads at once). The documents are the units samples are
// packed from and shuffled by: for a Megatron dataset its sequences (as Megatron's GPTDataset
// uses them), for a token stream its pieces ending in the end-of-document token (or the whole
// stream when no such token is given). splitPoints() says where a train/validation split may
// cut without tearing a document in two.
//
// openTokenSource() picks the reader from the path (`Format::Auto`): PREFIX with PREFIX.idx
// and PREFIX.bin, or either of those files → Megatron; a file or glob whose first file starts
// with an llm.c magic → llm.c shards; raw token files need their format named. Errors (no file
// matches, unreadable, invalid per data/formats.h) are tessera::Error naming the file.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/data/formats.h"

namespace tessera::data {

enum class Format { Auto, Megatron, Llmc, RawUInt16, RawUInt32 };
// "auto" | "megatron" | "llmc" | "raw-uint16" | "raw-uint32"; anything else is an error.
Format parseFormat(const std::string& s);
const char* formatName(Format f);

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t numDocuments() const = 0;
  virtual int64_t documentLength(int64_t doc) const = 0;
  // Tokens [offset, offset + count) of `doc`, widened into `out` (the range is checked).
  virtual void read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const = 0;
  // Ascending document indices a split may cut before, from 0 (numDocuments() implied last).
  virtual std::vector<int64_t> splitPoints() const = 0;
  // Where token `offset` of `doc` lives, for error messages ("FILE document D position P").
  virtual std::string where(int64_t doc, int64_t offset) const = 0;
  virtual int64_t numTokens() const = 0;
  virtual TokenType tokenType() const = 0;
  // One line: format, token type, documents, tokens, files.
  virtual std::string describe() const = 0;
  // Content fingerprint: every index byte and the data's size and sampled pages (cheap; a
  // different or rewritten dataset gives another value with near certainty).
  virtual uint64_t fingerprint() const = 0;
  const std::string& path() const { return path_; }

 protected:
  explicit TokenSource(std::string path) : path_(std::move(path)) {}
  void checkRange(int64_t doc, int64_t offset, int64_t count) const;

 private:
  std::string path_;
};

struct SourceOptions {
  Format format = Format::Auto;
  int64_t eodToken = -1;  // token streams: documents end at this token (-1: one document)
};

std::shared_ptr<const TokenSource> openTokenSource(const std::string& path, const SourceOptions& o = {});

// 64-bit hash of `n` bytes continuing `h` (fingerprints; not cryptographic).
uint64_t hashBytes(const uint8_t* p, size_t n, uint64_t h = 0x84222325cbf29ce4ull);
// hashBytes over up to 64 pages of 4 KiB spread evenly over a file of `n` bytes, and `n`.
uint64_t hashSampledPages(const uint8_t* p, size_t n, uint64_t h);

}  // namespace tessera::data
