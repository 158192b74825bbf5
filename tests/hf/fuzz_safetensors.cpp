// libFuzzer target for the safetensors header parser and encoder (src/hf/safetensors_format.cpp;
// built and run, bounded, by tests/data/run_fuzz.sh; CTest: hf.fuzz).
//
// One input is parsed as two files:
//  - raw: the input is the whole file (8-byte length, header, data);
//  - structured: the first 2 bytes (little-endian u16) are the size of a data section, the rest
//    is the header's JSON; the file is its length, the JSON and that many data bytes. Mutations
//    of the JSON then reach the JSON checks instead of failing the length check.
// When parseHeader returns, its promises (safetensors_format.h) are checked arithmetically, every
// tensor's bytes are read out of the file, an exactly-sized heap block (a promised offset outside
// it trips AddressSanitizer), and encodeHeader must re-encode the table without an error, which
// must parse back, before the same data section, to the same tensors and metadata.
// tessera::Error naming the file is the expected answer to bad input; any other exception, a
// broken promise (abort), a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "tessera/common/error.h"
#include "tessera/hf/safetensors_format.h"
#include "../data/fuzz_guard.h"

namespace {

using tessera::hf::Header;
using tessera::hf::TensorEntry;

const std::string kFile = "fuzz.safetensors";

[[noreturn]] void fail(const char* what, const std::string& name = "", long long a = 0, long long b = 0) {
  std::fprintf(stderr, "\n*** tessera fuzz_safetensors: broken promise: %s (tensor '%s', %lld, %lld)\n", what,
               name.c_str(), a, b);
  std::fflush(stderr);
  std::abort();
}

#define EXPECT_PROMISE(cond, ...)   \
  do {                              \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

template <typename F>
void guarded(const char* parser, F&& f) {
  tessera::fuzz::guarded("fuzz_safetensors", parser, kFile, std::forward<F>(f));
}

// The promises of a returned Header over a file of `size` bytes.
void checkHeader(const Header& h, size_t size) {
  using u128 = unsigned __int128;
  EXPECT_PROMISE(h.dataStart >= 8 && h.dataStart <= size && h.dataStart + h.dataBytes == size,
                 "data section does not end the file", "", static_cast<long long>(h.dataStart),
                 static_cast<long long>(h.dataBytes));
  uint64_t at = 0;
  for (const TensorEntry& t : h.tensors) {
    EXPECT_PROMISE(t.begin == at && t.begin <= t.end && t.end <= h.dataBytes, "tensors do not tile the data", t.name,
                   static_cast<long long>(t.begin), static_cast<long long>(t.end));
    u128 numel = 1, nonzero = 1;  // the product of the non-zero dimensions must fit int64
    for (int64_t d : t.shape) {
      EXPECT_PROMISE(d >= 0, "negative dimension", t.name, d);
      numel = d == 0 ? 0 : numel * static_cast<u128>(d);
      if (d > 0) nonzero *= static_cast<u128>(d);
      EXPECT_PROMISE(nonzero <= static_cast<u128>(INT64_MAX), "element count over int64", t.name, d);
    }
    EXPECT_PROMISE(static_cast<u128>(t.numel()) == numel, "numel() differs", t.name, t.numel());
    EXPECT_PROMISE(numel * tessera::hf::dtypeBytes(t.dtype) == t.end - t.begin, "bytes != numel x element size",
                   t.name, static_cast<long long>(t.end - t.begin));
    at = t.end;
  }
  EXPECT_PROMISE(at == h.dataBytes, "trailing data bytes", "", static_cast<long long>(at),
                 static_cast<long long>(h.dataBytes));
}

// Parses the file [data, data + size) (an exactly-sized heap block) and, when it parses, checks,
// reads and re-encodes it.
void fuzzFile(const uint8_t* data, size_t size) {
  Header h;
  bool parsed = false;
  guarded("parseHeader", [&] {
    h = tessera::hf::parseHeader(data, size, kFile);
    parsed = true;
  });
  if (!parsed) return;
  // A table that parsed must be readable, and re-encode and parse back without any error.
  try {
    checkHeader(h, size);
    uint64_t sum = 0;
    for (const TensorEntry& t : h.tensors) {
      const uint8_t* p = data + h.dataStart + t.begin;
      for (uint64_t i = 0; i < t.bytes(); ++i) sum += p[i];
      EXPECT_PROMISE(h.find(t.name) != nullptr, "find misses a tensor", t.name);
    }
    volatile uint64_t sink = sum;
    (void)sink;

    // Re-encoded, the same table parses back before the same data section.
    const std::string head = tessera::hf::encodeHeader(h.tensors, h.metadata, kFile);
    EXPECT_PROMISE(head.size() % 8 == 0, "encoded header not padded to 8", "", static_cast<long long>(head.size()));
    const size_t n = head.size() + h.dataBytes;
    std::unique_ptr<uint8_t[]> again(new uint8_t[n]);
    std::memcpy(again.get(), head.data(), head.size());
    if (h.dataBytes) std::memcpy(again.get() + head.size(), data + h.dataStart, h.dataBytes);
    const Header back = tessera::hf::parseHeader(again.get(), n, kFile);
    EXPECT_PROMISE(back.metadata == h.metadata, "metadata differs after a round trip");
    EXPECT_PROMISE(back.tensors.size() == h.tensors.size(), "tensor count differs after a round trip");
    for (const TensorEntry& t : h.tensors) {
      const TensorEntry* u = back.find(t.name);
      EXPECT_PROMISE(u && u->dtype == t.dtype && u->shape == t.shape && u->begin == t.begin && u->end == t.end,
                     "tensor differs after a round trip", t.name);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n*** tessera fuzz_safetensors: a header that parsed fails to re-encode or parse back: %s\n",
                 e.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::unique_ptr<uint8_t[]> file(new uint8_t[size]);
    if (size) std::memcpy(file.get(), data, size);
    fuzzFile(file.get(), size);
  }
  if (size >= 2) {
    const size_t dataBytes = data[0] | (static_cast<size_t>(data[1]) << 8);
    const size_t json = size - 2, n = 8 + json + dataBytes;
    std::unique_ptr<uint8_t[]> file(new uint8_t[n]);
    const uint64_t len = json;
    std::memcpy(file.get(), &len, 8);
    std::memcpy(file.get() + 8, data + 2, json);
    for (size_t i = 0; i < dataBytes; ++i) file[8 + json + i] = static_cast<uint8_t>(i * 131u + 7u);
    fuzzFile(file.get(), n);
  }
  return 0;
}
