#include "tessera/hf/safetensors_format.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/common/error.h"
#include "hf/json_io.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian, as tessera's hosts");

namespace tessera::hf {

namespace {

using Json = nlohmann::json;

struct DTypeInfo {
  DType type;
  const char* name;
  size_t bytes;
};
// In the enum's order.
constexpr DTypeInfo kDTypes[] = {{DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
                                 {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                                 {DType::I16, "I16", 2},  {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
                                 {DType::Bool, "BOOL", 1}};
constexpr bool inEnumOrder() {
  for (size_t i = 0; i < sizeof(kDTypes) / sizeof(kDTypes[0]); ++i) {
    if (static_cast<size_t>(kDTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(inEnumOrder(), "kDTypes is indexed by DType");
constexpr const char* kKnownDTypes = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";
constexpr const char* kMetadataKey = "__metadata__";

// A JSON value for a message: compact, invalid UTF-8 replaced, cut at 60 characters.
std::string show(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A non-negative JSON integer that fits int64.
bool asCount(const Json& v, int64_t* out) {
  if (!v.is_number_unsigned()) return false;  // negative integers are number_integer, fractions number_float
  const auto u = v.get<uint64_t>();
  if (u > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = static_cast<int64_t>(u);
  return true;
}

std::string shapeText(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Shape, offsets and bytes of one entry, against a data section of `dataBytes`.
void checkEntry(const TensorEntry& t, uint64_t dataBytes, const std::string& file) {
  int64_t numel = 1;
  bool overflow = false;
  for (int64_t d : t.shape) {
    TESSERA_CHECK(d >= 0, "tessera hf: '{}': tensor '{}': shape {} has a negative dimension", file, t.name,
                  shapeText(t.shape));
    if (d > 0) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  TESSERA_CHECK(!overflow, "tessera hf: '{}': tensor '{}': shape {} has more elements than int64 counts", file,
                t.name, shapeText(t.shape));
  TESSERA_CHECK(t.begin <= t.end, "tessera hf: '{}': tensor '{}': data_offsets [{}, {}] begin after they end", file,
                t.name, t.begin, t.end);
  TESSERA_CHECK(t.end <= dataBytes,
                "tessera hf: '{}': tensor '{}': data_offsets [{}, {}] lie past the data section's {} bytes (a "
                "truncated file?)",
                file, t.name, t.begin, t.end, dataBytes);
  uint64_t want = 0;
  const bool big = __builtin_mul_overflow(static_cast<uint64_t>(t.numel()), dtypeBytes(t.dtype), &want);
  TESSERA_CHECK(!big && want == t.end - t.begin,
                "tessera hf: '{}': tensor '{}': shape {} of {} needs {} bytes, data_offsets [{}, {}] hold {}", file,
                t.name, shapeText(t.shape), dtypeName(t.dtype), big ? std::string("over 2^64") : std::to_string(want),
                t.begin, t.end, t.end - t.begin);
}

// Sorts by offset and checks that the tensors tile [0, dataBytes) exactly.
void checkTiling(std::vector<TensorEntry>& ts, uint64_t dataBytes, const std::string& file) {
  std::sort(ts.begin(), ts.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : ts) {
    TESSERA_CHECK(t.begin >= at,
                  "tessera hf: '{}': tensor '{}' (data_offsets [{}, {}]) overlaps tensor '{}' ([{}, {}])", file,
                  t.name, t.begin, t.end, prev ? prev->name : "", prev ? prev->begin : 0, at);
    TESSERA_CHECK(t.begin == at,
                  "tessera hf: '{}': bytes [{}, {}) of the data section belong to no tensor (a gap before tensor "
                  "'{}')",
                  file, at, t.begin, t.name);
    at = t.end;
    prev = &t;
  }
  TESSERA_CHECK(at == dataBytes,
                "tessera hf: '{}': the tensors end at byte {} of the data section but it has {} bytes ({} trailing "
                "bytes belong to no tensor)",
                file, at, dataBytes, dataBytes - at);
}

TensorEntry parseEntry(const std::string& name, const Json& v, uint64_t dataBytes, const std::string& file) {
  TESSERA_CHECK(v.is_object(), "tessera hf: '{}': tensor '{}': its entry is {}, not an object with dtype, shape and "
                "data_offsets", file, name, show(v));
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    TESSERA_CHECK(v.contains(field), "tessera hf: '{}': tensor '{}': no '{}' in its entry {}", file, name, field,
                  show(v));
  }
  TensorEntry t;
  t.name = name;
  const Json& dtype = v["dtype"];
  TESSERA_CHECK(dtype.is_string() && parseDType(dtype.get<std::string>(), &t.dtype),
                "tessera hf: '{}': tensor '{}': unknown dtype {} (tessera reads {})", file, name, show(dtype),
                kKnownDTypes);
  const Json& shape = v["shape"];
  TESSERA_CHECK(shape.is_array(), "tessera hf: '{}': tensor '{}': shape {} is not an array", file, name, show(shape));
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = 0;
    TESSERA_CHECK(asCount(shape[i], &d), "tessera hf: '{}': tensor '{}': dimension {} of shape {} is not an integer "
                  "in [0, 2^63)", file, name, i, show(shape));
    t.shape.push_back(d);
  }
  const Json& offsets = v["data_offsets"];
  int64_t begin = 0, end = 0;
  TESSERA_CHECK(offsets.is_array() && offsets.size() == 2 && asCount(offsets[0], &begin) && asCount(offsets[1], &end),
                "tessera hf: '{}': tensor '{}': data_offsets {} are not two integers [begin, end] in [0, 2^63)", file,
                name, show(offsets));
  t.begin = static_cast<uint64_t>(begin);
  t.end = static_cast<uint64_t>(end);
  checkEntry(t, dataBytes, file);
  return t;
}

Metadata parseMetadata(const Json& v, const std::string& file) {
  Metadata m;
  if (v.is_null()) return m;
  TESSERA_CHECK(v.is_object(), "tessera hf: '{}': __metadata__ is {}, not an object of strings", file, show(v));
  for (const auto& [key, value] : v.items()) {
    TESSERA_CHECK(value.is_string(), "tessera hf: '{}': __metadata__ '{}' is {}, not a string", file, key,
                  show(value));
    m.emplace(key, value.get<std::string>());
  }
  return m;
}

}  // namespace

// Declared in hf/json_io.h; defined here so that the fuzz target needs only this source.
nlohmann::json parseJson(const char* text, size_t n, const std::string& what, const char* topKey) {
  using Json = nlohmann::json;
  std::vector<std::set<std::string>> open;  // the keys seen in each object being parsed
  std::string duplicate;
  size_t duplicateDepth = 0;
  auto onEvent = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == Json::parse_event_t::key && !open.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second && duplicate.empty()) {
        duplicate = key;
        duplicateDepth = open.size();
      }
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, text + n, onEvent);
  } catch (const Json::exception& e) {
    TESSERA_CHECK(false, "tessera hf: {} is not valid JSON: {}", what, e.what());
  }
  TESSERA_CHECK(duplicate.empty(), "tessera hf: {}: {} '{}' appears twice", what, duplicateDepth == 1 ? topKey : "key",
                duplicate);
  return j;
}

const char* dtypeName(DType t) { return kDTypes[static_cast<size_t>(t)].name; }
size_t dtypeBytes(DType t) { return kDTypes[static_cast<size_t>(t)].bytes; }

bool parseDType(const std::string& name, DType* out) {
  for (const auto& d : kDTypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorEntry* Header::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Header parseHeader(const uint8_t* data, size_t size, const std::string& file) {
  TESSERA_CHECK(size >= 8, "tessera hf: '{}' is truncated: {} bytes, a safetensors file starts with an 8-byte header "
                "length", file, size);
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  TESSERA_CHECK(n <= kMaxHeaderBytes, "tessera hf: '{}': header length {} is over the limit of {} bytes (not a "
                "safetensors file, or corrupt)", file, n, kMaxHeaderBytes);
  TESSERA_CHECK(n <= size - 8, "tessera hf: '{}': header length {} runs past the end of the {}-byte file (truncated, "
                "or not a safetensors file)", file, n, size);
  Header h;
  h.dataStart = 8 + n;
  h.dataBytes = size - h.dataStart;
  const Json j = parseJson(reinterpret_cast<const char*>(data + 8), n,
                           fmt::format("'{}': the {}-byte header", file, n), "tensor");
  TESSERA_CHECK(j.is_object(), "tessera hf: '{}': the header is JSON {}, not an object", file, j.type_name());
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      h.metadata = parseMetadata(value, file);
    } else {
      h.tensors.push_back(parseEntry(key, value, h.dataBytes, file));
    }
  }
  checkTiling(h.tensors, h.dataBytes, file);
  return h;
}

std::string encodeHeader(const std::vector<TensorEntry>& tensors, const Metadata& metadata, const std::string& file) {
  Json j = Json::object();
  uint64_t total = 0;
  for (const auto& t : tensors) {
    TESSERA_CHECK(t.name != kMetadataKey, "tessera hf: '{}': a tensor may not be named {}", file, kMetadataKey);
    TESSERA_CHECK(!j.contains(t.name), "tessera hf: '{}': tensor '{}' is given twice", file, t.name);
    checkEntry(t, UINT64_MAX, file);
    j[t.name] = {{"dtype", dtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
    total += t.bytes();
  }
  std::vector<TensorEntry> sorted = tensors;
  checkTiling(sorted, total, file);
  if (!metadata.empty()) j[kMetadataKey] = metadata;
  std::string text;
  try {
    text = j.dump();
  } catch (const Json::exception& e) {
    TESSERA_CHECK(false, "tessera hf: '{}': a tensor name or metadata string is not UTF-8: {}", file, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-aligned: 8 + N is a multiple of 8
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

}  // namespace tessera::hf
