#pragma once
// Sharded checkpoints: one directory per checkpoint, readable outside tessera (torch.load), where
// each rank writes its boxes of the unsharded tensors, read back into any layout (resharding).
// <dir> holds metadata.pt (every tensor's shape, dtype and pieces; the shard files' sizes and
// checksums; step, world, `extra`), metadata.sum (its checksum), rank-<r>.pt and save()'s `files`.
// A Piece is this rank's box [offset, offset + sizes) of the whole tensor `globalShape`: sharded
// tensors give disjoint boxes; replicated ones the same box on several ranks (the lowest writes it).
// save() is collective over `comm` and atomic: an interrupted save leaves the previous checkpoint at
// <dir>, or at <dir>.old, where load() and locate() find it. The directory must be one every rank
// sees (a shared file system across nodes). Reading is local. Pieces' tensors stay the caller's.
// Errors: tessera::Error naming the tensor or file: a requested box the saved pieces do not cover,
// a dtype or global-shape mismatch, a missing tensor, a truncated, corrupted or missing file.
// Readers (load, Reader, readMetadata) resolve <dir> as locate() does, so a run's root (series.h:
// step-<N> directories and `latest`) reads as its newest complete checkpoint.
// The format, the publication protocol and async saves (async_save.h): docs/design/checkpoints.md.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::checkpoint {

struct Piece {
  std::string name;                  // global name, e.g. "blocks.0.mlp.fc1.weight", "optim.exp_avg.<name>"
  std::vector<int64_t> globalShape;  // the whole tensor's shape
  std::vector<int64_t> offset;       // where `local` starts in it (all zeros: replicated/whole)
  at::Tensor local;                  // save: this rank's piece (any device); load: filled in place
  // Model state that is no parameter (an MoE router's selection bias): saved and loaded as it is,
  // never sharded by data parallelism, no optimizer moments.
  bool state = false;
};

// A whole tensor held by this rank (replicated or unsharded).
Piece whole(const std::string& name, const at::Tensor& t);
// `local` as chunk `index` of equal chunks along `dim` of a tensor of `globalShape` (what TP
// keeps): its offset along `dim` is index * local.size(dim). Error: `dim` out of range.
Piece chunkOf(const std::string& name, const at::Tensor& local, const std::vector<int64_t>& globalShape, int64_t dim,
              int64_t index);

struct Metadata {
  int64_t step = 0;
  int world = 0;
  std::map<std::string, std::string> extra;  // free-form (data position, config, ...)
  std::map<std::string, std::vector<int64_t>> shapes;
};

// Collective over `comm`: writes <dir>.tmp (every file fsynced), then rank 0 publishes it at <dir>.
// `extra` and `files` (more files of the checkpoint, name -> text, e.g. the run's config; plain
// names, not the checkpoint's own) are taken from rank 0.
void save(const std::string& dir, const std::vector<Piece>& pieces, Communicator& comm, int64_t step,
          const std::map<std::string, std::string>& extra = {}, const std::map<std::string, std::string>& files = {});
// Local: fills every piece's `local` (shape = the box's sizes) in place from <dir> (or <dir>.old),
// whatever layout saved it; returns the metadata. Reader(dir).load(pieces).
Metadata load(const std::string& dir, std::vector<Piece>& pieces);

// Example:
//   std::vector<tessera::checkpoint::Piece> pieces{tessera::checkpoint::whole("x", x)};
//   tessera::checkpoint::save("ckpt", pieces, *comm, /*step=*/1);  // every rank of comm
//   tessera::checkpoint::Metadata meta = tessera::checkpoint::load("ckpt", pieces);  // into x

// A checkpoint opened for reading piece by piece (local). The constructor reads and checks the
// metadata (at <dir>, or <dir>.old); each shard file is checked and memory-mapped when a piece first
// needs it. Memory holds the tensors asked for, never a whole shard file. Errors: as load().
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
// Local: reads and checks the metadata only (at <dir>, or <dir>.old as load() falls back).
Metadata readMetadata(const std::string& dir);
// Local: the directory holding the checkpoint to read for <dir>, as series.h's find() chooses it
// (the newest complete <dir>/step-<N>, else <dir>, else <dir>.old after a save interrupted between
// its renames); nullopt when <dir> holds no checkpoint. Error: checkpoint files but none complete.
std::optional<std::string> locate(const std::string& dir);

}  // namespace tessera::checkpoint
