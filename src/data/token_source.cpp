#include "tessera/data/token_source.h"

#include <algorithm>
#include <filesystem>

#include "common/choice.h"
#include "tessera/common/error.h"
#include "data/megatron.h"
#include "data/random.h"
#include "data/token_stream.h"

namespace tessera::data {

namespace {
constexpr Choices<Format, 5> kFormat{"data format",
                                     {{{Format::Auto, "auto"},
                                       {Format::Megatron, "megatron"},
                                       {Format::Llmc, "llmc"},
                                       {Format::RawUInt16, "raw-uint16"},
                                       {Format::RawUInt32, "raw-uint32"}}}};
}  // namespace

Format parseFormat(const std::string& s) { return kFormat.parse(s); }
const char* formatName(Format f) { return kFormat.name(f); }

void TokenSource::checkRange(int64_t doc, int64_t offset, int64_t count) const {
  TESSERA_CHECK(doc >= 0 && doc < numDocuments(), "tessera data: document {} out of range [0, {}) in '{}'", doc,
                numDocuments(), path_);
  const int64_t len = documentLength(doc);
  TESSERA_CHECK(offset >= 0 && count >= 0 && offset <= len && count <= len - offset,
                "tessera data: tokens [{}, {}) out of range of document {} ({} tokens) in '{}'", offset,
                offset + count, doc, len, path_);
}

uint64_t hashBytes(const uint8_t* p, size_t n, uint64_t h) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w) + i;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix64(h ^ tail ^ (static_cast<uint64_t>(n) << 3));
}

uint64_t hashSampledPages(const uint8_t* p, size_t n, uint64_t h) {
  constexpr size_t kPage = 4096, kPages = 64;
  h = mix64(h ^ n);
  if (n <= kPage * kPages) return hashBytes(p, n, h);
  for (size_t k = 0; k < kPages; ++k) {
    const size_t at = (n - kPage) / (kPages - 1) * k;
    h = hashBytes(p + at, kPage, h);
  }
  return h;
}

std::shared_ptr<const TokenSource> openTokenSource(const std::string& path, const SourceOptions& o) {
  namespace fs = std::filesystem;
  Format f = o.format;
  if (f == Format::Auto) {
    const std::string prefix = megatronPrefix(path);
    // PREFIX.idx decides; a PREFIX that names no file but PREFIX.bin is a Megatron prefix whose
    // .idx is missing (IndexedDataset names it).
    if (fs::exists(prefix + ".idx") || (!fs::exists(path) && fs::exists(prefix + ".bin"))) {
      f = Format::Megatron;
    } else {
      // The glob's first file decides; TokenStream checks them all.
      std::vector<std::string> files;
      try {
        files = globFiles(path);
      } catch (const Error&) {
        throw Error(fmt::format("tessera data: no dataset at '{}': no '{}.idx' (Megatron) and no file matching '{}'",
                                path, prefix, path));
      }
      MappedFile first(files.front());
      TESSERA_CHECK(looksLikeLlmc(first.data(), first.size()),
                    "tessera data: cannot tell the format of '{}': no '{}.idx' beside it (Megatron) and '{}' does not "
                    "start with an llm.c magic; raw token files need their format named (raw-uint16 or raw-uint32)",
                    path, prefix, first.path());
      f = Format::Llmc;
    }
  }
  if (f == Format::Megatron) return std::make_shared<IndexedDataset>(path);
  return std::make_shared<TokenStream>(path, f, o.eodToken);
}

}  // namespace tessera::data
