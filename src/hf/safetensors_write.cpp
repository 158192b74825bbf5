// The writers of hf/safetensors.h: one file, or a checkpoint sharded at a size limit.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "common/error.h"
#include "hf/json_io.h"
#include "hf/safetensors.h"

namespace tessera::hf {

namespace fs = std::filesystem;

namespace {

DType dtypeFor(const std::string& name, const at::Tensor& t, const std::string& file) {
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

uint64_t tensorBytes(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

// Writes tensors[i] for i in `which` to `path`.
void writeFile(const std::string& path, const NamedTensors& tensors, std::vector<size_t> which, Metadata metadata) {
  metadata.emplace("format", "pt");  // kept when the caller gave one
  std::vector<DType> dtypes(tensors.size());
  for (size_t i : which) dtypes[i] = dtypeFor(tensors[i].first, tensors[i].second, path);
  // Largest elements first: every tensor then starts at a multiple of its element size.
  std::stable_sort(which.begin(), which.end(), [&](size_t a, size_t b) {
    return dtypeBytes(dtypes[a]) > dtypeBytes(dtypes[b]);
  });
  std::vector<TensorEntry> entries;
  uint64_t offset = 0;
  for (size_t i : which) {
    TensorEntry e;
    e.name = tensors[i].first;
    e.dtype = dtypes[i];
    e.shape = tensors[i].second.sizes().vec();
    e.begin = offset;
    e.end = offset += tensorBytes(tensors[i].second);
    entries.push_back(std::move(e));
  }
  const std::string header = encodeHeader(entries, metadata, path);
  AtomicFile out(path);
  out.write(header.data(), header.size());
  for (size_t i : which) {
    const at::Tensor cpu = tensors[i].second.detach().to(at::kCPU).contiguous();
    TESSERA_CHECK(tensorBytes(cpu) == tensorBytes(tensors[i].second), "tessera hf: '{}': tensor '{}' changed size",
                  path, tensors[i].first);
    if (cpu.numel() > 0) out.write(cpu.data_ptr(), tensorBytes(cpu));
  }
  out.commit();
}

}  // namespace

void writeSafetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  std::vector<size_t> all(tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  writeFile(path, tensors, all, metadata);
}

std::vector<std::string> writeCheckpoint(const std::string& dir, const NamedTensors& tensors,
                                         const Metadata& metadata, const WriteOptions& options) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    TESSERA_CHECK(seen.insert(name).second, "tessera hf: '{}': tensor '{}' is given twice", dir, name);
    dtypeFor(name, t, dir);
  }
  // Hugging Face's split: in order; a tensor that would take a non-empty file past the limit
  // starts the next one.
  std::vector<std::vector<size_t>> shards;
  uint64_t inShard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensorBytes(tensors[i].second);
    if (shards.empty() || (inShard > 0 && inShard + bytes > options.maxShardBytes)) {
      shards.emplace_back();
      inShard = 0;
    }
    shards.back().push_back(i);
    inShard += bytes;
    total += bytes;
  }
  if (shards.empty()) shards.emplace_back();
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSERA_CHECK(!ec, "tessera hf: cannot create the directory '{}': {}", dir, ec.message());

  std::vector<std::string> written;
  if (shards.size() == 1) {
    writeFile((fs::path(dir) / kSingleFile).string(), tensors, shards[0], metadata);
    written.push_back(kSingleFile);
  } else {
    nlohmann::json weightMap = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      writeFile((fs::path(dir) / name).string(), tensors, shards[s], metadata);
      for (size_t i : shards[s]) weightMap[tensors[i].first] = name;
      written.push_back(name);
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weightMap}};
    writeJsonFile((fs::path(dir) / kIndexFile).string(), index);
    written.push_back(kIndexFile);
  }
  // What an earlier checkpoint left here would otherwise be read instead (a stale index) or beside.
  const std::regex shardName(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kSingleFile || name == kIndexFile || std::regex_match(name, shardName);
    if (ours && std::find(written.begin(), written.end(), name) == written.end()) fs::remove(entry.path(), ec);
  }
  return written;
}

}  // namespace tessera::hf
