#pragma once
// The on-disk token formats tessera reads, as pure parsers over bytes (local; no torch, no
// I/O: the readers hand them a mapped file, the fuzzers arbitrary bytes). Every check failure is
// a tessera::Error naming the file and what is wrong; a parser that returns has validated every
// offset it hands out, so reading through the result cannot leave the buffers.
//
// Megatron-LM indexed dataset (PREFIX.idx beside PREFIX.bin), little-endian:
//   9-byte magic "MMIDIDX\0\0"; u64 version = 1; u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32,
//   5 int64, 6 float64, 7 float32, 8 uint16); u64 sequence count S; u64 document-index count D;
//   int32 lengths[S]; int64 byte pointers into .bin[S]; int64 document indices[D] (0 first, then
//   the sequence count at the end of each document, so the last equals S).
// llm.c token shard: 256 little-endian int32 (magic, version, token count, zeros), then the
//   tokens: magic 20240520 / version 1 / uint16, or magic 20240801 / version 7 / uint32.
// Raw token file (nanoGPT's train.bin): uint16 or uint32 tokens, no header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tessera::data {

enum class TokenType : uint8_t { UInt16, Int32, UInt32 };
size_t tokenBytes(TokenType t);
const char* tokenTypeName(TokenType t);

// Token `i` of an array of `t` at `p` (unaligned-safe), widened to int64.
inline int64_t tokenAt(const uint8_t* p, TokenType t, int64_t i) {
  switch (t) {
    case TokenType::UInt16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return v;
    }
    case TokenType::Int32: {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    default: {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
  }
}
// Converts `n` tokens at `p` into `out`.
void widenTokens(const uint8_t* p, TokenType t, int64_t n, int64_t* out);

// A validated .idx: its arrays stay in the caller's buffer (read with the accessors).
struct MegatronIndex {
  TokenType type = TokenType::UInt16;
  int64_t sequences = 0;     // S
  int64_t docIndices = 0;    // D (= documents + 1 for Megatron's writer)
  const uint8_t* base = nullptr;
  int32_t length(int64_t i) const { return load<int32_t>(kHeader + 4 * i); }
  int64_t pointer(int64_t i) const { return load<int64_t>(kHeader + 4 * sequences + 8 * i); }
  int64_t docIndex(int64_t k) const { return load<int64_t>(kHeader + 12 * sequences + 8 * k); }
  static constexpr size_t kHeader = 34;

 private:
  template <typename T>
  T load(size_t off) const {
    T v;
    std::memcpy(&v, base + off, sizeof(T));
    return v;
  }
};

// Parses and checks an .idx of `size` bytes against its .bin's size: magic, version, a dtype
// tessera reads (uint16, int32), the file size the counts imply (exactly), every sequence inside
// the .bin and aligned, document indices from 0, non-decreasing, ending at S.
MegatronIndex parseMegatronIndex(const uint8_t* data, size_t size, uint64_t binBytes, const std::string& idxFile);

struct LlmcHeader {
  TokenType type = TokenType::UInt16;
  int64_t tokens = 0;
  static constexpr size_t kBytes = 256 * 4;
};
// Parses an llm.c shard's header; `size` is the whole file's size, which must be the header
// plus exactly the token count it states.
LlmcHeader parseLlmcHeader(const uint8_t* data, size_t size, const std::string& file);
// Whether the file starts like an llm.c shard (either magic).
bool looksLikeLlmc(const uint8_t* data, size_t size);

// A raw token file's token count; its size must be a multiple of the token size.
int64_t rawTokenCount(size_t size, TokenType t, const std::string& file);

}  // namespace tessera::data
