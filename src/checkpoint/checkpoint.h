#pragma once
// Sharded checkpoints: one directory per checkpoint, readable outside tessera.
//
// Layout of <dir>:
//   metadata.pt      torch.load-able dict: {"version", "world", "step", "tensors": {name: {"shape",
//                    "dtype", "pieces": [{"file", "key", "offset", "sizes"}]}}, "files": {file:
//                    {"bytes", "fnv1a64"}}, "extra": {str: str}, "checksummed": True}
//   metadata.sum     "fnv1a64 <hex> bytes <n>": metadata.pt's checksum, checked before it is read
//   rank-<r>.pt      torch.load-able dict {key: tensor} of the pieces rank r wrote.
// Files are LibTorch's own pickle/zip serialisation (torch::pickle_save; torch.load reads them).
//
// A tensor is described by pieces: each rank says which box [offset, offset + sizes) of the
// whole tensor (`globalShape`) its local tensor holds. Sharded tensors (FSDP shards, TP splits,
// PP stages) give disjoint boxes; replicated ones (DDP) give the same box on several ranks,
// and only the lowest such rank writes it.
//
// Contract:
// - save() is collective over `comm`. It writes into "<dir>.tmp", fsyncs every file, then rank 0
//   writes metadata.pt and renames <dir> → <dir>.old, <dir>.tmp → <dir>: an interrupted save (a
//   rank killed, an error) never replaces the previous good checkpoint, which is at <dir>, or at
//   <dir>.old when the save died between its renames; load() and locate() fall back to it.
//   async_save.h saves the same files while training goes on. The directory must be on a file system every rank
//   sees (local disk on one node; a shared one across nodes).
// - load() is collective over `comm` only in that every rank reads; it needs no particular
//   world size or layout: each requested piece is assembled from whatever saved pieces overlap
//   it (resharding: other dp/tp/pp degrees, DDP <-> FSDP). A requested box not fully covered by
//   the saved pieces, a dtype or global-shape mismatch, a missing tensor, a truncated or
//   corrupted file (shards: size and FNV-1a checksum in the metadata; the metadata: in
//   metadata.sum) → tessera::Error naming the tensor or file.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace tessera::checkpoint {

struct Piece {
  std::string name;                  // global name, e.g. "blocks.0.mlp.fc1.weight", "optim.exp_avg.<name>"
  std::vector<int64_t> globalShape;  // the whole tensor's shape
  std::vector<int64_t> offset;       // where `local` starts in it (all zeros: replicated/whole)
  at::Tensor local;                  // save: this rank's piece (any device); load: filled in place
};

// A whole tensor held by this rank (replicated or unsharded).
Piece whole(const std::string& name, const at::Tensor& t);
// This rank's chunk `index` of `count` equal chunks of `full` along `dim` (what TP keeps).
Piece chunkOf(const std::string& name, const at::Tensor& local, const std::vector<int64_t>& globalShape, int64_t dim,
              int64_t index);

struct Metadata {
  int64_t step = 0;
  int world = 0;
  std::map<std::string, std::string> extra;  // free-form (data position, config, ...)
  std::map<std::string, std::vector<int64_t>> shapes;
};

// Collective over `comm`. `extra` and `files` (more files of the checkpoint, name -> text, e.g. the
// run's config; plain names, not the checkpoint's own) are taken from rank 0.
void save(const std::string& dir, const std::vector<Piece>& pieces, Communicator& comm, int64_t step,
          const std::map<std::string, std::string>& extra = {}, const std::map<std::string, std::string>& files = {});
// Fills every piece's `local` (shape = the box's sizes) in place from <dir>; returns metadata.
// Reader(dir).load(pieces).
Metadata load(const std::string& dir, std::vector<Piece>& pieces);

// A checkpoint opened for reading piece by piece (local). The constructor reads and checks
// metadata.pt (at <dir>, or <dir>.old as load() falls back); each shard file is checked (size,
// checksum) and memory-mapped the first time a piece needs it, then kept mapped. Pieces are
// copied out of the mapped pages, so this process's memory holds the tensors asked for, never a
// whole shard file (the pages read are the kernel's page cache). Errors: as load().
class Reader {
 public:
  explicit Reader(const std::string& dir);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  const Metadata& metadata() const;
  const std::string& dir() const;  // where the checkpoint was found
  bool contains(const std::string& name) const;
  // As load(dir, pieces).
  void load(std::vector<Piece>& pieces);
  // The whole tensor `name` in its saved dtype, on the CPU, in fresh memory.
  at::Tensor read(const std::string& name);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Reads and checks <dir>/metadata.pt only.
Metadata readMetadata(const std::string& dir);
// Local: the directory that holds the checkpoint saved to <dir>: <dir>, or <dir>.old when a save
// was interrupted between its renames; nullopt when there is none.
std::optional<std::string> locate(const std::string& dir);

}  // namespace tessera::checkpoint
