// libFuzzer target for the pure header parsers in src/data/formats.{h,cpp} (built and run,
// bounded, by tests/data/run_fuzz.sh; CTest: data.fuzz).
//
// One input exercises all of them:
//  - Megatron: the first 8 bytes (when present) are a little-endian u64 that picks the .bin's size
//    (modulo kMaxBin + 1, so the fake .bin stays small), the rest is the .idx. When
//    parseMegatronIndex returns, every length, pointer and document index is read back through
//    the MegatronIndex accessors, the documented invariants are checked, and every sequence's
//    tokens are widened out of a fake .bin that is a heap block of exactly that size, so an offset
//    the parser promised but that lies outside either buffer trips AddressSanitizer. The same .idx
//    is parsed a second time against the raw, unbounded u64 as the .bin size (overflow paths),
//    checking the promises arithmetically. A structure-aware pass also rewrites the .idx's two
//    counts so that they fit its length (the exact-size check otherwise rejects nearly every
//    mutation) and parses that as well.
//  - llm.c: the whole input is the shard; when parseLlmcHeader returns, all its tokens are
//    widened from the input buffer (libFuzzer hands it over as an exactly-sized heap block).
//  - Raw token files: rawTokenCount for both widths, then all tokens widened.
// tessera::Error is the expected answer to bad input (and must name the file, as formats.h
// promises); any other exception, a broken invariant (abort), a crash or a sanitizer report is a
// finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/common/error.h"
#include "tessera/data/formats.h"
#include "fuzz_guard.h"

namespace {

using tessera::data::LlmcHeader;
using tessera::data::MegatronIndex;
using tessera::data::TokenType;

constexpr uint64_t kMaxBin = 1u << 16;  // the fake .bin is at most 64 KiB
const std::string kIdxFile = "fuzz.idx";
const std::string kBinFile = "fuzz.bin";

[[noreturn]] void fail(const char* what, long long a = 0, long long b = 0, long long c = 0) {
  std::fprintf(stderr, "\n*** tessera fuzz_formats: broken promise: %s (%lld, %lld, %lld)\n", what, a, b, c);
  std::fflush(stderr);
  std::abort();
}

#define EXPECT_PROMISE(cond, ...) \
  do {                            \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

template <typename F>
void guarded(const char* parser, const std::string& file, F&& f) {
  tessera::fuzz::guarded("fuzz_formats", parser, file, std::forward<F>(f));
}

// The checks every returned MegatronIndex must pass (formats.h), arithmetic only.
void checkIndex(const MegatronIndex& ix, const uint8_t* idx, size_t idxSize, uint64_t binBytes) {
  using u128 = unsigned __int128;
  EXPECT_PROMISE(ix.base == idx, "index base is not the .idx buffer");
  EXPECT_PROMISE(ix.type == TokenType::UInt16 || ix.type == TokenType::Int32, "index token type",
                 static_cast<int>(ix.type));
  EXPECT_PROMISE(ix.sequences >= 0 && ix.docIndices >= 1, "index counts", ix.sequences, ix.docIndices);
  EXPECT_PROMISE(static_cast<u128>(MegatronIndex::kHeader) + 12 * static_cast<u128>(ix.sequences) +
                         8 * static_cast<u128>(ix.docIndices) ==
                     idxSize,
                 "index counts do not match the .idx size", ix.sequences, ix.docIndices,
                 static_cast<long long>(idxSize));
  const auto bytes = static_cast<int64_t>(tessera::data::tokenBytes(ix.type));
  for (int64_t i = 0; i < ix.sequences; ++i) {
    const int64_t len = ix.length(i), ptr = ix.pointer(i);
    EXPECT_PROMISE(len >= 0 && ptr >= 0 && ptr % bytes == 0, "sequence length/pointer", i, len, ptr);
    EXPECT_PROMISE(static_cast<u128>(ptr) + static_cast<u128>(len) * static_cast<u128>(bytes) <= binBytes,
                   "sequence outside the .bin", i, len, ptr);
  }
  EXPECT_PROMISE(ix.docIndex(0) == 0, "first document index", ix.docIndex(0));
  for (int64_t k = 1; k < ix.docIndices; ++k) {
    EXPECT_PROMISE(ix.docIndex(k) >= ix.docIndex(k - 1) && ix.docIndex(k) <= ix.sequences,
                   "document indices decrease or exceed the sequences", k, ix.docIndex(k), ix.docIndex(k - 1));
  }
  EXPECT_PROMISE(ix.docIndex(ix.docIndices - 1) == ix.sequences, "last document index", ix.docIndex(ix.docIndices - 1),
                 ix.sequences);
}

// Parses `idx` (n bytes, copied into an exactly-sized heap block so reads before or past it trip
// ASan) against a .bin of binBytes (a fake one is allocated and every sequence read from it),
// then against the raw u64 (arithmetic promises only).
void fuzzIndex(const uint8_t* bytes, size_t n, uint64_t binBytes, uint64_t raw) {
  std::unique_ptr<uint8_t[]> idx(new uint8_t[n]);
  if (n) std::memcpy(idx.get(), bytes, n);

  guarded("parseMegatronIndex", kIdxFile, [&] {
    const MegatronIndex ix = tessera::data::parseMegatronIndex(idx.get(), n, binBytes, kIdxFile);
    checkIndex(ix, idx.get(), n, binBytes);
    // A fake .bin of exactly binBytes bytes; every sequence's tokens are read out of it.
    std::unique_ptr<uint8_t[]> bin(new uint8_t[binBytes]);
    for (uint64_t i = 0; i < binBytes; ++i) bin[i] = static_cast<uint8_t>(i * 131u + 7u);
    std::vector<int64_t> out;
    int64_t sum = 0;
    for (int64_t i = 0; i < ix.sequences; ++i) {
      const int64_t len = ix.length(i), ptr = ix.pointer(i);
      out.resize(static_cast<size_t>(len));
      tessera::data::widenTokens(bin.get() + ptr, ix.type, len, out.data());
      if (len > 0) {
        // Spot-check widenTokens against tokenAt.
        EXPECT_PROMISE(out[len - 1] == tessera::data::tokenAt(bin.get() + ptr, ix.type, len - 1),
                       "widenTokens disagrees with tokenAt", i, len);
        sum += out[0];
      }
    }
    // Documents: [docIndex(k-1), docIndex(k)) are sequence ranges.
    for (int64_t k = 1; k < ix.docIndices; ++k) {
      for (int64_t s = ix.docIndex(k - 1); s < ix.docIndex(k); ++s) sum += ix.length(s);
    }
    volatile int64_t sink = sum;
    (void)sink;
  });

  // The raw u64 as the .bin's size (huge values included): only the arithmetic promises.
  if (raw != binBytes) {
    guarded("parseMegatronIndex (raw .bin size)", kIdxFile, [&] {
      const MegatronIndex ix = tessera::data::parseMegatronIndex(idx.get(), n, raw, kIdxFile);
      checkIndex(ix, idx.get(), n, raw);
    });
  }
}

void fuzzMegatron(const uint8_t* data, size_t size) {
  uint64_t raw = 0;
  size_t skip = 0;
  if (size >= 8) {
    for (int b = 7; b >= 0; --b) raw = (raw << 8) | data[b];
    skip = 8;
  }
  const uint64_t binBytes = raw % (kMaxBin + 1);
  const uint8_t* idx = data + skip;
  const size_t n = size - skip;
  fuzzIndex(idx, n, binBytes, raw);

  // Structure-aware variant: the .idx must be exactly as long as its two counts imply, which
  // random mutations rarely keep. Rewrite the counts so they fit (S modulo what fits, D all that
  // is left, the tail trimmed) and parse that too, so the checks past the size check (lengths,
  // pointers, document indices, D = 0) see many more inputs.
  constexpr size_t H = MegatronIndex::kHeader;
  if (n < H) return;
  uint64_t s = 0;
  std::memcpy(&s, idx + 18, 8);
  s %= (n - H) / 12 + 1;
  const uint64_t d = (n - H - 12 * s) / 8;
  const size_t m = H + 12 * s + 8 * d;
  std::vector<uint8_t> fixed(idx, idx + m);
  std::memcpy(fixed.data() + 18, &s, 8);
  std::memcpy(fixed.data() + 26, &d, 8);
  if (m == n && std::memcmp(fixed.data(), idx, n) == 0) return;  // already consistent
  fuzzIndex(fixed.data(), m, binBytes, raw);
}

void fuzzLlmc(const uint8_t* data, size_t size) {
  const bool looks = tessera::data::looksLikeLlmc(data, size);
  guarded("parseLlmcHeader", kBinFile, [&] {
    const LlmcHeader h = tessera::data::parseLlmcHeader(data, size, kBinFile);
    EXPECT_PROMISE(looks, "parseLlmcHeader accepted what looksLikeLlmc rejects");
    EXPECT_PROMISE(h.type == TokenType::UInt16 || h.type == TokenType::UInt32, "llm.c token type",
                   static_cast<int>(h.type));
    EXPECT_PROMISE(h.tokens >= 0 && h.tokens <= static_cast<int64_t>(size), "llm.c token count", h.tokens);
    // Widen first (a token past the input trips ASan, with the stack), then check the size.
    std::vector<int64_t> out(static_cast<size_t>(h.tokens));
    tessera::data::widenTokens(data + LlmcHeader::kBytes, h.type, h.tokens, out.data());
    EXPECT_PROMISE(LlmcHeader::kBytes + static_cast<uint64_t>(h.tokens) * tessera::data::tokenBytes(h.type) == size,
                   "llm.c token count does not match the file size", h.tokens, static_cast<long long>(size));
    if (h.tokens > 0) {
      EXPECT_PROMISE(out.back() == tessera::data::tokenAt(data + LlmcHeader::kBytes, h.type, h.tokens - 1),
                     "widenTokens disagrees with tokenAt");
    }
  });
}

void fuzzRaw(const uint8_t* data, size_t size) {
  for (TokenType t : {TokenType::UInt16, TokenType::UInt32}) {
    guarded("rawTokenCount", kBinFile, [&] {
      const int64_t n = tessera::data::rawTokenCount(size, t, kBinFile);
      EXPECT_PROMISE(n >= 0 && static_cast<uint64_t>(n) * tessera::data::tokenBytes(t) == size,
                     "raw token count does not match the file size", n, static_cast<long long>(size));
      std::vector<int64_t> out(static_cast<size_t>(n));
      tessera::data::widenTokens(data, t, n, out.data());
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzzMegatron(data, size);
  fuzzLlmc(data, size);
  fuzzRaw(data, size);
  return 0;
}
