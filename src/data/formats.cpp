#include "tessera/data/formats.h"

#include "tessera/common/error.h"

namespace tessera::data {

namespace {
constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int32_t kLlmcMagic16 = 20240520, kLlmcMagic32 = 20240801;

template <typename T>
T loadAt(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

const char* megatronDtypeName(int code) {
  static const char* names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? names[code] : "unknown";
}
}  // namespace

size_t tokenBytes(TokenType t) { return t == TokenType::UInt16 ? 2 : 4; }

const char* tokenTypeName(TokenType t) {
  switch (t) {
    case TokenType::UInt16:
      return "uint16";
    case TokenType::Int32:
      return "int32";
    default:
      return "uint32";
  }
}

namespace {
template <typename T>
void widen(const uint8_t* __restrict p, int64_t n, int64_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + sizeof(T) * i, sizeof(T));
    out[i] = v;
  }
}
}  // namespace

void widenTokens(const uint8_t* p, TokenType t, int64_t n, int64_t* out) {
  switch (t) {
    case TokenType::UInt16:
      return widen<uint16_t>(p, n, out);
    case TokenType::Int32:
      return widen<int32_t>(p, n, out);
    default:
      return widen<uint32_t>(p, n, out);
  }
}

MegatronIndex parseMegatronIndex(const uint8_t* data, size_t size, uint64_t binBytes, const std::string& file) {
  constexpr size_t H = MegatronIndex::kHeader;
  TESSERA_CHECK(size >= H, "tessera data: '{}' is truncated: {} bytes, a Megatron index header needs {}", file, size,
                H);
  TESSERA_CHECK(std::memcmp(data, kMagic, 9) == 0,
                "tessera data: '{}' is not a Megatron index: wrong magic (expected \"MMIDIDX\\0\\0\")", file);
  const auto version = loadAt<uint64_t>(data, 9);
  TESSERA_CHECK(version == 1, "tessera data: '{}': unknown index version {} (tessera reads version 1)", file, version);
  const int code = data[17];
  TESSERA_CHECK(code == 4 || code == 8,
                "tessera data: '{}': unsupported token dtype code {} ({}); tessera reads uint16 (code 8) and int32 "
                "(code 4)",
                file, code, megatronDtypeName(code));
  MegatronIndex ix;
  ix.type = code == 8 ? TokenType::UInt16 : TokenType::Int32;
  ix.base = data;
  const auto s = loadAt<uint64_t>(data, 18), d = loadAt<uint64_t>(data, 26);
  // The arrays' size as the counts imply it, without overflow: each count is at most the file.
  TESSERA_CHECK(s <= size && d <= size,
                "tessera data: '{}' is truncated or corrupt: it counts {} sequences and {} document indices in {} "
                "bytes",
                file, s, d, size);
  const uint64_t want = H + 12 * s + 8 * d;
  TESSERA_CHECK(want == size,
                "tessera data: '{}': {} sequences and {} document indices need {} bytes, the file has {} ({})", file,
                s, d, want, size, want > size ? "truncated" : "counts do not add up");
  ix.sequences = static_cast<int64_t>(s);
  ix.docIndices = static_cast<int64_t>(d);
  const auto bytes = static_cast<int64_t>(tokenBytes(ix.type));
  for (int64_t i = 0; i < ix.sequences; ++i) {
    const int64_t len = ix.length(i), ptr = ix.pointer(i);
    TESSERA_CHECK(len >= 0 && ptr >= 0 && ptr % bytes == 0 && static_cast<uint64_t>(ptr) <= binBytes &&
                      static_cast<uint64_t>(len) * bytes <= binBytes - static_cast<uint64_t>(ptr),
                  "tessera data: '{}': sequence {} (length {}, byte pointer {}) lies outside the .bin of {} bytes{}",
                  file, i, len, ptr, binBytes, ptr % bytes ? " or is not aligned to its tokens" : "");
  }
  TESSERA_CHECK(d >= 1 && ix.docIndex(0) == 0, "tessera data: '{}': document indices must start at 0 (got {})", file,
                d ? std::to_string(ix.docIndex(0)) : "none");
  for (int64_t k = 1; k < ix.docIndices; ++k) {
    TESSERA_CHECK(ix.docIndex(k) >= ix.docIndex(k - 1) && ix.docIndex(k) <= ix.sequences,
                  "tessera data: '{}': document index {} is {} after {} (must not decrease nor exceed the {} "
                  "sequences)",
                  file, k, ix.docIndex(k), ix.docIndex(k - 1), ix.sequences);
  }
  TESSERA_CHECK(ix.docIndex(ix.docIndices - 1) == ix.sequences,
                "tessera data: '{}': the last document index is {}, not the sequence count {}", file,
                ix.docIndex(ix.docIndices - 1), ix.sequences);
  // Every sequence inside the .bin is not enough: a .bin of another, larger dataset passes that. The
  // tokens the index describes fill the .bin exactly (Megatron's writers and tessera-prep's do).
  uint64_t described = 0;
  for (int64_t i = 0; i < ix.sequences; ++i) described += static_cast<uint64_t>(ix.length(i)) * bytes;
  TESSERA_CHECK(described == binBytes,
                "tessera data: '{}' describes {} bytes of tokens, but its .bin has {} (the .bin and .idx of different "
                "datasets? tessera-prep inspect PREFIX checks a pair)",
                file, described, binBytes);
  return ix;
}

bool looksLikeLlmc(const uint8_t* data, size_t size) {
  if (size < 4) return false;
  const auto magic = loadAt<int32_t>(data, 0);
  return magic == kLlmcMagic16 || magic == kLlmcMagic32;
}

LlmcHeader parseLlmcHeader(const uint8_t* data, size_t size, const std::string& file) {
  TESSERA_CHECK(size >= LlmcHeader::kBytes, "tessera data: '{}' is truncated: {} bytes, an llm.c header needs {}",
                file, size, LlmcHeader::kBytes);
  const auto magic = loadAt<int32_t>(data, 0), version = loadAt<int32_t>(data, 4);
  const auto count = loadAt<int32_t>(data, 8);
  TESSERA_CHECK(magic == kLlmcMagic16 || magic == kLlmcMagic32,
                "tessera data: '{}' is not an llm.c token shard: magic {} (expected {} or {})", file, magic,
                kLlmcMagic16, kLlmcMagic32);
  const bool wide = magic == kLlmcMagic32;
  TESSERA_CHECK(version == (wide ? 7 : 1), "tessera data: '{}': unknown llm.c version {} for magic {} (expected {})",
                file, version, magic, wide ? 7 : 1);
  TESSERA_CHECK(count >= 0, "tessera data: '{}': negative token count {} in the header", file, count);
  LlmcHeader h;
  h.type = wide ? TokenType::UInt32 : TokenType::UInt16;
  h.tokens = count;
  const uint64_t want = LlmcHeader::kBytes + static_cast<uint64_t>(count) * tokenBytes(h.type);
  TESSERA_CHECK(want == size, "tessera data: '{}': the header says {} {} tokens ({} bytes with the header), the file has {} ({})",
                file, count, tokenTypeName(h.type), want, size, want > size ? "truncated" : "trailing bytes");
  return h;
}

int64_t rawTokenCount(size_t size, TokenType t, const std::string& file) {
  TESSERA_CHECK(size % tokenBytes(t) == 0, "tessera data: '{}' has {} bytes, not a whole number of {} tokens", file,
                size, tokenTypeName(t));
  return static_cast<int64_t>(size / tokenBytes(t));
}

}  // namespace tessera::data
