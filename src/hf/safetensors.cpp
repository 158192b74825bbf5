#include "tessera/hf/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "tessera/common/error.h"
#include "data/mapped_file.h"
#include "hf/json_io.h"

namespace tessera::hf {

namespace fs = std::filesystem;

at::ScalarType scalarType(DType t) {
  switch (t) {
    case DType::F64:
      return at::kDouble;
    case DType::F32:
      return at::kFloat;
    case DType::F16:
      return at::kHalf;
    case DType::BF16:
      return at::kBFloat16;
    case DType::I64:
      return at::kLong;
    case DType::I32:
      return at::kInt;
    case DType::I16:
      return at::kShort;
    case DType::I8:
      return at::kChar;
    case DType::U8:
      return at::kByte;
    default:
      return at::kBool;
  }
}

namespace {

std::shared_ptr<const data::MappedFile> mapSafetensors(const std::string& path) {
  std::error_code ec;
  TESSERA_CHECK(fs::is_regular_file(path, ec), "tessera hf: '{}' {}", path,
                fs::exists(path, ec) ? "is not a regular file" : "does not exist");
  return std::make_shared<const data::MappedFile>(path, data::MapMode::CopyOnWrite);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(mapSafetensors(path)) {
  header_ = parseHeader(map_->data(), map_->size(), path_);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : header_.tensors) out.push_back(t.name);
  return out;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  TESSERA_CHECK(it != index_.end(), "tessera hf: '{}' has no tensor '{}' ({} tensors)", path_, name,
                header_.tensors.size());
  return header_.tensors[it->second];
}

namespace {

// [begin, end) of a dimension of `size`, kAll resolved; an error names the file and tensor.
std::pair<int64_t, int64_t> resolve(Range r, int64_t size, const char* what, const std::string& file,
                                    const TensorEntry& e) {
  const int64_t end = r.end == Range::kAll ? size : r.end;
  TESSERA_CHECK(r.begin >= 0 && r.begin <= end && end <= size,
                "tessera hf: '{}': tensor '{}' of shape [{}]: {} [{}, {}) is not inside [0, {})", file, e.name,
                fmt::join(e.shape, ", "), what, r.begin, r.end == Range::kAll ? std::string("end") : std::to_string(end),
                size);
  return {r.begin, end};
}

bool whole(Range r) { return r.begin == 0 && r.end == Range::kAll; }

}  // namespace

at::Tensor SafetensorsFile::get(const std::string& name) const { return slice(name, Range{}, Range{}); }

at::Tensor SafetensorsFile::slice(const std::string& name, Range rows, Range cols) const {
  const TensorEntry& e = entry(name);
  const auto type = scalarType(e.dtype);
  const auto esize = static_cast<int64_t>(dtypeBytes(e.dtype));
  std::vector<int64_t> shape = e.shape;
  TESSERA_CHECK(whole(rows) || !shape.empty(), "tessera hf: '{}': tensor '{}' is a scalar: it has no rows to slice",
                path_, name);
  TESSERA_CHECK(whole(cols) || shape.size() >= 2,
                "tessera hf: '{}': tensor '{}' of shape [{}] has no dimension 1 to take columns of", path_, name,
                fmt::join(shape, ", "));
  // Rows [r0, r1) are one contiguous run of bytes.
  int64_t first = 0, bytes = static_cast<int64_t>(e.bytes());
  if (!shape.empty()) {
    const auto [r0, r1] = resolve(rows, shape[0], "rows", path_, e);
    const int64_t rowBytes = shape[0] > 0 ? bytes / shape[0] : 0;
    first = r0 * rowBytes;
    bytes = (r1 - r0) * rowBytes;
    shape[0] = r1 - r0;
  }
  std::pair<int64_t, int64_t> c{0, 0};
  if (!whole(cols)) c = resolve(cols, shape[1], "columns", path_, e);

  at::Tensor t;
  auto* p = const_cast<uint8_t*>(map_->data()) + header_.dataStart + e.begin + first;  // copy-on-write pages
  if (bytes == 0) {
    t = at::empty(shape, at::TensorOptions().dtype(type));
  } else {
    if (e.dtype == DType::Bool) {
      for (int64_t i = 0; i < bytes; ++i) {
        TESSERA_CHECK(p[i] <= 1, "tessera hf: '{}': tensor '{}' (BOOL) holds byte {} at element {}: not 0 or 1",
                      path_, name, static_cast<int>(p[i]), first + i);
      }
    }
    if (reinterpret_cast<uintptr_t>(p) % esize == 0) {
      auto keep = map_;  // the tensor holds the mapping alive
      t = at::from_blob(p, shape, [keep](void*) {}, at::TensorOptions().dtype(type));
    } else {
      t = at::empty(shape, at::TensorOptions().dtype(type));
      std::memcpy(t.data_ptr(), p, static_cast<size_t>(bytes));
    }
  }
  if (!whole(cols)) t = t.narrow(1, c.first, c.second - c.first);
  return t;
}

// --- a checkpoint: an index and its shards, or one file ---

namespace {

std::string listNames(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
  return out;
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  const fs::path p(path);
  TESSERA_CHECK(fs::exists(p), "tessera hf: checkpoint '{}' does not exist", path);
  if (fs::is_directory(p) && fs::exists(p / kIndexFile)) {
    addIndexed(path);
    return;
  }
  const fs::path file = fs::is_directory(p) ? p / kSingleFile : p;
  TESSERA_CHECK(fs::exists(file), "tessera hf: '{}' has neither {} nor {}", path, kIndexFile, kSingleFile);
  files_.emplace_back(file.string());
  for (const auto& name : files_[0].names()) where_.emplace(name, 0);
}

void SafetensorsCheckpoint::addIndexed(const std::string& dir) {
  const std::string indexPath = (fs::path(dir) / kIndexFile).string();
  const auto index = readJsonFile(indexPath);
  TESSERA_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                "tessera hf: '{}' has no \"weight_map\" object (name -> file)", indexPath);
  std::map<std::string, std::vector<std::string>> byFile;  // file -> the names the index puts there
  std::map<std::string, std::string> fileOfName;
  for (const auto& [name, value] : index["weight_map"].items()) {
    TESSERA_CHECK(value.is_string(), "tessera hf: '{}': tensor '{}' is mapped to {}, not a file name", indexPath,
                  name, value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    const auto file = value.get<std::string>();
    const fs::path rel(file);
    bool inside = !file.empty() && rel.is_relative();
    for (const auto& part : rel) inside = inside && part != "..";
    TESSERA_CHECK(inside, "tessera hf: '{}': tensor '{}' is mapped to '{}', not a file inside the directory",
                  indexPath, name, file);
    byFile[file].push_back(name);
    fileOfName.emplace(name, file);
  }
  for (const auto& [file, names] : byFile) {
    const fs::path shard = fs::path(dir) / file;
    TESSERA_CHECK(fs::is_regular_file(shard), "tessera hf: '{}' maps tensor '{}' to '{}', which does not exist",
                  indexPath, names.front(), shard.string());
    files_.emplace_back(shard.string());
    const SafetensorsFile& f = files_.back();
    for (const auto& name : names) {
      TESSERA_CHECK(f.contains(name), "tessera hf: '{}' maps tensor '{}' to '{}', which has no such tensor", indexPath,
                    name, f.path());
      where_.emplace(name, files_.size() - 1);
    }
    for (const auto& name : f.names()) {
      const auto it = fileOfName.find(name);
      TESSERA_CHECK(it != fileOfName.end(), "tessera hf: '{}' holds tensor '{}', which '{}' does not list",
                    f.path(), name, indexPath);
      TESSERA_CHECK(it->second == file, "tessera hf: '{}' holds tensor '{}', which '{}' maps to '{}'", f.path(), name,
                    indexPath, it->second);
    }
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::fileOf(const std::string& name) const {
  const auto it = where_.find(name);
  TESSERA_CHECK(it != where_.end(), "tessera hf: checkpoint '{}' has no tensor '{}' ({} tensors in {} files)", path_,
                name, where_.size(), files_.size());
  return files_[it->second];
}

uint64_t SafetensorsCheckpoint::tensorBytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f.header().dataBytes;
  return total;
}

void SafetensorsCheckpoint::expectNames(const std::vector<std::string>& expected) const {
  const std::set<std::string> want(expected.begin(), expected.end());
  std::vector<std::string> missing, unexpected;
  for (const auto& name : want) {
    if (!contains(name)) missing.push_back("'" + name + "'");
  }
  for (const auto& [name, file] : where_) {
    if (!want.count(name)) unexpected.push_back(fmt::format("'{}' (in {})", name, files_[file].path()));
  }
  TESSERA_CHECK(missing.empty() && unexpected.empty(),
                "tessera hf: checkpoint '{}' does not hold the expected tensors: {} missing{}{}; {} unexpected{}{}",
                path_, missing.size(), missing.empty() ? "" : ": ", listNames(missing), unexpected.size(),
                unexpected.empty() ? "" : ": ", listNames(unexpected));
}

}  // namespace tessera::hf
