#pragma once
// safetensors files and Hugging Face checkpoints of them, read and written by tessera. Local (no
// communication: every rank that calls reads or writes on its own). The format and its checks:
// hf/safetensors_format.h.
// Reading maps the file (private, copy-on-write) and reads only what is asked: get() and slice()
// return CPU tensors over the mapping (a copy of just the rows asked for when the data is not
// aligned to its element size), each holding the mapping alive, so tensors outlive the reader.
// Writing into one never changes the file but may be seen by another read of it: clone() to own
// memory. The file must not be truncated while mapped (SIGBUS). Readers are immutable once
// constructed: reads from several threads are safe.
// Errors: tessera::Error naming the file (or directory) and the tensor: a malformed or missing
// file, a tensor the file or checkpoint lacks, a slice outside the tensor, BOOL bytes other than 0
// and 1, an index inconsistent with its shards. Design: docs/design/hf.md.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/hf/safetensors_format.h"

namespace tessera::data {
class MappedFile;
}

namespace tessera::hf {

// [begin, end) along one dimension; end = kAll: up to the dimension's size.
struct Range {
  static constexpr int64_t kAll = -1;
  int64_t begin = 0;
  int64_t end = kAll;
};

at::ScalarType scalarType(DType t);

// One .safetensors file, mapped and its header checked when constructed.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const Metadata& metadata() const { return header_.metadata; }
  std::vector<std::string> names() const;  // in the file's data order
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;

  // The whole tensor.
  at::Tensor get(const std::string& name) const;
  // Rows `rows` of dim 0 and columns `cols` of dim 1 (a tensor-parallel shard): a view of the
  // rows narrowed to the columns (not contiguous when `cols` is a strict part).
  at::Tensor slice(const std::string& name, Range rows, Range cols = {}) const;

 private:
  std::string path_;
  std::shared_ptr<const data::MappedFile> map_;
  Header header_;
  std::map<std::string, size_t> index_;  // name -> header_.tensors[i]
};

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// A Hugging Face checkpoint: a directory with model.safetensors.index.json and its shards, or with
// one model.safetensors; or `path` names one .safetensors file. Constructing it maps every file and
// checks that every file the index names exists and that the index and the shards hold the same
// tensors, each in its file (total_size is not checked: docs/design/hf.md).
// Example:
//   tessera::hf::SafetensorsCheckpoint ck("/models/Llama-3.2-1B");  // a directory or one file
//   at::Tensor table = ck.get("model.embed_tokens.weight");         // over the mapping, no copy
//   at::Tensor rows = ck.slice("model.layers.0.mlp.up_proj.weight", {0, 1024});
//   tessera::hf::writeCheckpoint("/tmp/export", {{"model.embed_tokens.weight", table}});
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsFile& fileOf(const std::string& name) const;
  const TensorEntry& entry(const std::string& name) const { return fileOf(name).entry(name); }
  uint64_t tensorBytes() const;  // all tensors' bytes

  at::Tensor get(const std::string& name) const { return fileOf(name).get(name); }
  at::Tensor slice(const std::string& name, Range rows, Range cols = {}) const {
    return fileOf(name).slice(name, rows, cols);
  }
  // Exactly `expected` (a model's parameter names): else an error listing the missing and the
  // unexpected tensors, each with its file.
  void expectNames(const std::vector<std::string>& expected) const;

 private:
  void addIndexed(const std::string& dir);
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // name -> files_[i]
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;  // Hugging Face's "5GB"

struct WriteOptions {
  // Tensor bytes per file: a tensor that would take a file past it starts the next file (a
  // tensor larger than the limit has a file of its own).
  uint64_t maxShardBytes = kDefaultMaxShardBytes;
};

// Writes `tensors` (any device, a dtype of DType; each copied to the CPU in turn) and `metadata`
// (plus "format": "pt" unless given) to one file at `path`, atomically, every tensor aligned.
// Errors: duplicate or "__metadata__" names, an undefined or non-strided tensor, a dtype
// safetensors lacks, I/O failures; each names the file and tensor.
void writeSafetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

// Writes a checkpoint into `dir` (created if needed) as Hugging Face does: model.safetensors, or
// model-0000k-of-0000N.safetensors in the order given plus the index (written after its shards).
// Each file is replaced atomically; then an earlier checkpoint's other files in `dir` are removed.
// Returns the file names written.
std::vector<std::string> writeCheckpoint(const std::string& dir, const NamedTensors& tensors,
                                         const Metadata& metadata = {}, const WriteOptions& options = {});

// What a streamed tensor will be: its name, dtype and shape, known before its values.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// writeCheckpoint one tensor at a time (memory: the tensor being written), for tensors that do not
// fit in memory together: files planned from `specs` as writeCheckpoint splits them; within a file
// the specs' element sizes must not grow (one dtype always passes). Each file is replaced
// atomically when its last tensor is written; destroyed before finish(), the file being written is
// removed and no index is written. Local. Errors: duplicate names, a tensor of another name, dtype
// or shape than its spec, write() past the last spec or finish() before it, I/O failures; each
// names the file and tensor.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, std::vector<TensorSpec> specs, Metadata metadata = {}, WriteOptions options = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // `t` (any device; copied to the CPU) is the next spec's tensor; `name` must be the spec's.
  void write(const std::string& name, const at::Tensor& t);
  // Writes the index and removes what an earlier checkpoint left, as writeCheckpoint; returns the
  // file names written.
  std::vector<std::string> finish();
  const std::vector<TensorSpec>& specs() const { return specs_; }
  uint64_t bytesWritten() const { return written_; }

 private:
  struct Impl;
  std::string dir_;
  std::vector<TensorSpec> specs_;
  uint64_t written_ = 0;
  std::unique_ptr<Impl> impl_;
};

// The safetensors dtype of a tensor's scalar type; an error naming `file` and `name` when
// safetensors lacks it.
DType dtypeOf(const std::string& name, const at::Tensor& t, const std::string& file);

}  // namespace tessera::hf
