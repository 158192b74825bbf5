#include "data/token_stream.h"

#include <ATen/ATen.h>
#include <glob.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "data/random.h"

namespace tessera::data {

std::vector<std::string> globFiles(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  TESSERA_CHECK(!out.empty(), "tessera data: no file matches '{}'", pattern);
  std::sort(out.begin(), out.end());
  return out;
}

TokenStream::TokenStream(const std::string& pattern, Format format, int64_t eodToken)
    : TokenSource(pattern), format_(format), eod_(eodToken), names_(globFiles(pattern)) {
  TESSERA_CHECK(format == Format::Llmc || format == Format::RawUInt16 || format == Format::RawUInt32,
                "tessera data: '{}': a token stream is llmc, raw-uint16 or raw-uint32, not {}", pattern,
                formatName(format));
  fileStart_.push_back(0);
  for (size_t f = 0; f < names_.size(); ++f) {
    files_.emplace_back(names_[f]);
    const auto& m = files_.back();
    int64_t count;
    TokenType type;
    if (format == Format::Llmc) {
      const auto h = parseLlmcHeader(m.data(), m.size(), m.path());
      type = h.type;
      count = h.tokens;
      header_.push_back(LlmcHeader::kBytes);
    } else {
      type = format == Format::RawUInt16 ? TokenType::UInt16 : TokenType::UInt32;
      count = rawTokenCount(m.size(), type, m.path());
      header_.push_back(0);
    }
    TESSERA_CHECK(f == 0 || type == type_, "tessera data: '{}' holds {} tokens, '{}' {}: one stream has one token type",
                  m.path(), tokenTypeName(type), names_[0], tokenTypeName(type_));
    type_ = type;
    fileStart_.push_back(fileStart_.back() + count);
  }
  const int64_t total = fileStart_.back();
  docStart_.push_back(0);
  if (eod_ >= 0) {
    for (size_t f = 0; f < files_.size(); ++f) {
      const uint8_t* p = files_[f].data() + header_[f];
      const int64_t n = fileStart_[f + 1] - fileStart_[f];
      for (int64_t i = 0; i < n; ++i) {
        if (tokenAt(p, type_, i) == eod_ && fileStart_[f] + i + 1 < total) docStart_.push_back(fileStart_[f] + i + 1);
      }
    }
  }
  if (total > 0) docStart_.push_back(total);
}

size_t TokenStream::fileOf(int64_t token) const {
  // The last file starting at or before `token` that is not empty.
  return static_cast<size_t>(std::upper_bound(fileStart_.begin(), fileStart_.end() - 1, token) - fileStart_.begin()) - 1;
}

void TokenStream::readStream(int64_t start, int64_t count, int64_t* out) const {
  while (count > 0) {
    const size_t f = fileOf(start);
    const int64_t at = start - fileStart_[f], n = std::min(count, fileStart_[f + 1] - start);
    widenTokens(files_[f].data() + header_[f] + at * static_cast<int64_t>(tokenBytes(type_)), type_, n, out);
    start += n;
    count -= n;
    out += n;
  }
}

int64_t TokenStream::documentLength(int64_t doc) const {
  TESSERA_CHECK(doc >= 0 && doc < numDocuments(), "tessera data: document {} out of range [0, {}) in '{}'", doc,
                numDocuments(), path());
  return docStart_[doc + 1] - docStart_[doc];
}

void TokenStream::read(int64_t doc, int64_t offset, int64_t count, int64_t* out) const {
  checkRange(doc, offset, count);
  readStream(docStart_[doc] + offset, count, out);
}

at::Tensor TokenStream::tokens(int64_t start, int64_t count) const {
  TESSERA_CHECK(start >= 0 && count >= 0 && start <= numTokens() && count <= numTokens() - start,
                "tessera data: tokens [{}, {}) out of range of the {} tokens of '{}'", start, start + count,
                numTokens(), path());
  auto t = at::empty({count}, at::kLong);
  readStream(start, count, t.data_ptr<int64_t>());
  return t;
}

std::vector<int64_t> TokenStream::splitPoints() const {
  std::vector<int64_t> out(std::max<int64_t>(1, numDocuments()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(i);
  return out;
}

std::string TokenStream::where(int64_t doc, int64_t offset) const {
  const int64_t t = docStart_[doc] + offset;
  const size_t f = fileOf(t);
  return fmt::format("'{}' token {} (document {} position {})", names_[f], t - fileStart_[f], doc, offset);
}

std::string TokenStream::describe() const {
  return fmt::format("{} {} '{}': {} file{}, {} documents{}, {} tokens", formatName(format_), tokenTypeName(type_),
                     path(), names_.size(), names_.size() == 1 ? "" : "s", numDocuments(),
                     eod_ >= 0 ? fmt::format(" (ending at token {})", eod_) : " (no end-of-document token given)",
                     numTokens());
}

uint64_t TokenStream::fingerprint() const {
  uint64_t h = mix64(static_cast<uint64_t>(format_) * 31 + static_cast<uint64_t>(eod_ + 1));
  for (const auto& m : files_) h = hashSampledPages(m.data(), m.size(), h);
  return h;
}

}  // namespace tessera::data
