// The writers of hf/safetensors.h: one file, a checkpoint sharded at a size limit, and the
// same checkpoint streamed one tensor at a time (CheckpointWriter; writeCheckpoint uses it).
#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>

#include "tessera/common/error.h"
#include "hf/json_io.h"
#include "tessera/hf/safetensors.h"

namespace tessera::hf {

namespace fs = std::filesystem;

DType dtypeOf(const std::string& name, const at::Tensor& t, const std::string& file) {
  TESSERA_CHECK(t.defined(), "tessera hf: '{}': tensor '{}' is undefined", file, name);
  TESSERA_CHECK(t.layout() == at::kStrided, "tessera hf: '{}': tensor '{}' is not a dense (strided) tensor", file,
                name);
  for (DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16, DType::I8,
                  DType::U8, DType::Bool}) {
    if (scalarType(d) == t.scalar_type()) return d;
  }
  TESSERA_CHECK(false, "tessera hf: '{}': tensor '{}' has dtype {}, which safetensors (as tessera writes it) lacks",
                file, name, c10::toString(t.scalar_type()));
  return DType::F32;
}

uint64_t TensorSpec::bytes() const {
  uint64_t n = dtypeBytes(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

TensorSpec specOf(const std::string& name, const at::Tensor& t, const std::string& file) {
  return {name, dtypeOf(name, t, file), t.sizes().vec()};
}

// Hugging Face's split: in order; a tensor that would take a non-empty file past the limit
// starts the next one. Returns the index of each file's first spec (at least one file).
std::vector<size_t> splitFiles(const std::vector<TensorSpec>& specs, uint64_t maxBytes) {
  std::vector<size_t> starts{0};
  uint64_t inFile = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t b = specs[i].bytes();
    if (inFile > 0 && inFile + b > maxBytes) {
      starts.push_back(i);
      inFile = 0;
    }
    inFile += b;
  }
  return starts;
}

std::string fileName(size_t k, size_t n) {
  return n == 1 ? std::string(kSingleFile) : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
}

}  // namespace

struct CheckpointWriter::Impl {
  Metadata metadata;
  std::vector<size_t> starts;  // first spec of each file
  size_t next = 0;             // the next spec to write
  size_t file = 0;             // the file it goes to
  std::optional<AtomicFile> out;
  std::vector<std::string> written;

  size_t endOf(size_t k, size_t total) const { return k + 1 < starts.size() ? starts[k + 1] : total; }
};

CheckpointWriter::CheckpointWriter(std::string dir, std::vector<TensorSpec> specs, Metadata metadata,
                                   WriteOptions options)
    : dir_(std::move(dir)), specs_(std::move(specs)), impl_(std::make_unique<Impl>()) {
  std::set<std::string> seen;
  for (const auto& s : specs_) {
    TESSERA_CHECK(seen.insert(s.name).second, "tessera hf: '{}': tensor '{}' is given twice", dir_, s.name);
  }
  impl_->metadata = std::move(metadata);
  impl_->metadata.emplace("format", "pt");  // kept when the caller gave one
  impl_->starts = splitFiles(specs_, options.maxShardBytes);
  for (size_t k = 0; k < impl_->starts.size(); ++k) {
    for (size_t i = impl_->starts[k] + 1; i < impl_->endOf(k, specs_.size()); ++i) {
      TESSERA_CHECK(dtypeBytes(specs_[i].dtype) <= dtypeBytes(specs_[i - 1].dtype),
                    "tessera hf: '{}': tensor '{}' ({}) follows '{}' ({}) in one file: larger elements must come first",
                    dir_, specs_[i].name, dtypeName(specs_[i].dtype), specs_[i - 1].name, dtypeName(specs_[i - 1].dtype));
    }
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  TESSERA_CHECK(!ec, "tessera hf: cannot create the directory '{}': {}", dir_, ec.message());
}

CheckpointWriter::~CheckpointWriter() = default;  // an uncommitted AtomicFile removes its temporary file

void CheckpointWriter::write(const std::string& name, const at::Tensor& t) {
  auto& m = *impl_;
  TESSERA_CHECK(m.next < specs_.size(), "tessera hf: '{}': tensor '{}' is written after the last of the {} planned",
                dir_, name, specs_.size());
  const TensorSpec& s = specs_[m.next];
  const size_t nFiles = m.starts.size();
  const std::string path = (fs::path(dir_) / fileName(m.file, nFiles)).string();
  TESSERA_CHECK(name == s.name, "tessera hf: '{}': tensor '{}' is written where '{}' is planned", path, name, s.name);
  const DType d = dtypeOf(name, t, path);
  TESSERA_CHECK(d == s.dtype && t.sizes().vec() == s.shape,
                "tessera hf: '{}': tensor '{}' is {} [{}], planned as {} [{}]", path, name, dtypeName(d),
                fmt::join(t.sizes(), ", "), dtypeName(s.dtype), fmt::join(s.shape, ", "));
  if (!m.out) {  // the file's first tensor: its header
    std::vector<TensorEntry> entries;
    uint64_t offset = 0;
    for (size_t i = m.starts[m.file]; i < m.endOf(m.file, specs_.size()); ++i) {
      TensorEntry e;
      e.name = specs_[i].name;
      e.dtype = specs_[i].dtype;
      e.shape = specs_[i].shape;
      e.begin = offset;
      e.end = offset += specs_[i].bytes();
      entries.push_back(std::move(e));
    }
    const std::string header = encodeHeader(entries, m.metadata, path);
    m.out.emplace(path);
    m.out->write(header.data(), header.size());
  }
  const at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
  if (cpu.numel() > 0) m.out->write(cpu.data_ptr(), s.bytes());
  written_ += s.bytes();
  ++m.next;
  if (m.next == m.endOf(m.file, specs_.size())) {
    m.out->commit();
    m.out.reset();
    m.written.push_back(fileName(m.file, nFiles));
    ++m.file;
  }
}

std::vector<std::string> CheckpointWriter::finish() {
  auto& m = *impl_;
  TESSERA_CHECK(m.next == specs_.size(), "tessera hf: '{}': finish() after {} of the {} planned tensors", dir_, m.next,
                specs_.size());
  if (specs_.empty()) {  // one file without tensors
    const std::string path = (fs::path(dir_) / kSingleFile).string();
    const std::string header = encodeHeader({}, m.metadata, path);
    AtomicFile out(path);
    out.write(header.data(), header.size());
    out.commit();
    m.written.push_back(kSingleFile);
  }
  if (m.starts.size() > 1) {
    nlohmann::json weightMap = nlohmann::json::object();
    uint64_t total = 0;
    for (size_t k = 0; k < m.starts.size(); ++k) {
      for (size_t i = m.starts[k]; i < m.endOf(k, specs_.size()); ++i) {
        weightMap[specs_[i].name] = fileName(k, m.starts.size());
        total += specs_[i].bytes();
      }
    }
    writeJsonFile((fs::path(dir_) / kIndexFile).string(),
                  nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weightMap}});
    m.written.push_back(kIndexFile);
  }
  // What an earlier checkpoint left here would otherwise be read instead (a stale index) or beside.
  const std::regex shardName(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSingleFile || name == kIndexFile || std::regex_match(name, shardName);
    if (ours && std::find(m.written.begin(), m.written.end(), name) == m.written.end()) fs::remove(entry.path(), ec);
  }
  return m.written;
}

void writeSafetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  std::set<std::string> seen;
  std::vector<size_t> order;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TESSERA_CHECK(seen.insert(tensors[i].first).second, "tessera hf: '{}': tensor '{}' is given twice", path,
                  tensors[i].first);
    dtypeOf(tensors[i].first, tensors[i].second, path);
    order.push_back(i);
  }
  // Largest elements first: every tensor then starts at a multiple of its element size.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].second.element_size() > tensors[b].second.element_size();
  });
  Metadata md = metadata;
  md.emplace("format", "pt");
  std::vector<TensorEntry> entries;
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto s = specOf(tensors[i].first, tensors[i].second, path);
    entries.push_back({s.name, s.dtype, s.shape, offset, offset + s.bytes()});
    offset += s.bytes();
  }
  const std::string header = encodeHeader(entries, md, path);
  AtomicFile out(path);
  out.write(header.data(), header.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const at::Tensor cpu = tensors[order[k]].second.detach().to(at::kCPU).contiguous();
    if (cpu.numel() > 0) out.write(cpu.data_ptr(), entries[k].bytes());
  }
  out.commit();
}

std::vector<std::string> writeCheckpoint(const std::string& dir, const NamedTensors& tensors,
                                         const Metadata& metadata, const WriteOptions& options) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back(specOf(name, t, dir));
  // Files as Hugging Face splits them in the given order; within a file, largest elements first
  // (alignment). Reordering inside a file keeps the split: its partial sums stay under its total.
  const auto starts = splitFiles(specs, options.maxShardBytes);
  std::vector<size_t> order;
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t begin = order.size(), end = k + 1 < starts.size() ? starts[k + 1] : specs.size();
    for (size_t i = starts[k]; i < end; ++i) order.push_back(i);
    std::stable_sort(order.begin() + static_cast<std::ptrdiff_t>(begin), order.end(), [&](size_t a, size_t b) {
      return dtypeBytes(specs[a].dtype) > dtypeBytes(specs[b].dtype);
    });
  }
  std::vector<TensorSpec> ordered;
  for (size_t i : order) ordered.push_back(specs[i]);
  CheckpointWriter w(dir, std::move(ordered), metadata, options);
  for (size_t i : order) w.write(tensors[i].first, tensors[i].second);
  return w.finish();
}

}  // namespace tessera::hf
