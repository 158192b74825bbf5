#pragma once
// The safetensors format (Hugging Face) as a pure parser and encoder over bytes: local, no torch,
// no I/O (the reader hands the parser a mapped file, the fuzzer arbitrary bytes).
// Layout: u64 little-endian N; N bytes of UTF-8 JSON {name: {"dtype": "F32", "shape": [d0, ...],
// "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}} (tessera's encoder pads it with
// spaces so the data starts at a multiple of 8); then the data section, each tensor's row-major
// little-endian bytes at [begin, end) counted from the byte after the header.
// A header that parses has every tensor's bytes inside the file, so reading through it cannot
// leave the buffer. Errors: tessera::Error naming the file and, where there is one, the tensor.
// Every check and why it is made: docs/design/hf.md.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::hf {

// The dtypes tessera reads (those LibTorch 1.13 has); it writes any of them.
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool };
const char* dtypeName(DType t);  // "F32", "BF16", "BOOL", ...
size_t dtypeBytes(DType t);
// The dtype named `name`; false when tessera does not know it.
bool parseDType(const std::string& name, DType* out);

using Metadata = std::map<std::string, std::string>;

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data section
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

struct Header {
  uint64_t dataStart = 0;            // file offset of the data section: 8 + N
  uint64_t dataBytes = 0;            // its size: the file's size - dataStart
  std::vector<TensorEntry> tensors;  // in data order (by begin)
  Metadata metadata;
  // The entry named `name`, or nullptr.
  const TensorEntry* find(const std::string& name) const;
};

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // Hugging Face's limit on N

// Parses and checks the header of a whole file ([data, data + size); `file` names it in errors), as
// Hugging Face's reader does: N, JSON without duplicate keys, dtypes, shapes, offsets, metadata,
// and the tensors tiling the data section exactly. Keys of an entry other than the three are ignored.
Header parseHeader(const uint8_t* data, size_t size, const std::string& file);

// The first 8 + N bytes of a file holding `tensors` and `metadata`: the length, the JSON, spaces
// up to a multiple of 8. The entries pass the checks parseHeader makes (offsets tiling [0, their
// total bytes) in some order, bytes = elements x element size, unique names, none
// "__metadata__"); names and metadata must be UTF-8. Errors name `file` and the tensor.
std::string encodeHeader(const std::vector<TensorEntry>& tensors, const Metadata& metadata, const std::string& file);

}  // namespace tessera::hf
