#pragma once
// Internal to src/checkpoint: the three steps of a save, shared by save() (one after the other,
// with barriers) and AsyncSaver (the first on the caller's thread, the others on a writer thread).
//   1. plan (collective over comm): checks the pieces, rank 0 empties <dir>.tmp, the ranks agree
//      which of them writes each replicated box (the lowest rank holding it);
//   2. writeShard (local): rank r's pieces, already in host memory, pickled into
//      <dir>.tmp/rank-r.pt and the index of its boxes into rank-r.index.pt, both fsynced;
//   3. publish (rank 0, once every rank's writeShard is done): the index files merged into
//      metadata.pt (+ metadata.sum, its checksum), `files` (name -> text) written beside them, then
//      renames: <dir> → <dir>.old, <dir>.tmp →
//      <dir>, <dir>.old removed. At every instant a complete checkpoint is at <dir> or <dir>.old.
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"

namespace tessera::checkpoint::detail {

struct ShardPlan {
  std::string dir;
  int rank = 0, world = 0;
  std::vector<Piece> owned;  // the pieces this rank writes (their `local` as given)
};

// The piece fits its global shape (dims, offset + sizes); else an error naming `op` and the tensor.
void checkPiece(const Piece& p, const char* op);
ShardPlan plan(const std::string& dir, const std::vector<Piece>& pieces, Communicator& comm);
// `host[k]`: owned[k].local's values in host memory.
void writeShard(const ShardPlan& p, const std::vector<at::Tensor>& host);
// `files`: more files of the checkpoint (name -> text) written beside metadata.pt; `shardFiles`: how
// many rank-<k>.pt files there are (0: one per rank of `world`; a single-process stream writer
// writes several).
void publish(const std::string& dir, int world, int64_t step, const std::map<std::string, std::string>& extra,
             const std::map<std::string, std::string>& files, int shardFiles = 0);
// After a failed writeShard or publish (a full or read-only disk): <dir>.tmp removed, best effort
// and silently (the save's own error is the one to report). Any rank may call it.
void discard(const std::string& dir);

}  // namespace tessera::checkpoint::detail
