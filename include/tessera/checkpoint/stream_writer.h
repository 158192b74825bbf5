#pragma once
// A checkpoint written by one process a tensor at a time (tessera-convert import-hf: a model
// larger than memory), in the format of checkpoint.h: whole tensors as pieces, grouped into
// shard files rank-0.pt, rank-1.pt, ... of about maxFileBytes each, then metadata.pt and
// metadata.sum, published as save() does (written into <dir>.tmp, renamed onto <dir>; a
// previous checkpoint at <dir> stays until then). Its metadata says world 1. load() and Reader
// read it into any layout. Local (no communication).
// Memory: the group being filled (at most maxFileBytes, or one larger tensor) twice while the
// group is serialised; host tensors spanning their whole storage are kept, not copied. Errors: a
// tensor given twice, add() after finish(), I/O failures (naming the file).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"

namespace tessera::checkpoint {

struct StreamWriterOptions {
  uint64_t maxFileBytes = 1ull << 30;  // a group reaching it is written out
};

class StreamWriter {
 public:
  // Empties <dir>.tmp.
  explicit StreamWriter(std::string dir, StreamWriterOptions o = {});
  // The whole tensor `name`. A contiguous host tensor spanning its whole storage is kept as it is
  // until its group is written (the caller must not modify it meanwhile); any other is copied to
  // host memory now.
  void add(const std::string& name, const at::Tensor& t);
  // Writes the last group and publishes the checkpoint at `step` with `extra`.
  void finish(int64_t step, const std::map<std::string, std::string>& extra);
  int files() const { return files_; }

 private:
  void flush();
  std::string dir_;
  StreamWriterOptions o_;
  std::vector<Piece> group_;
  std::vector<at::Tensor> host_;
  uint64_t groupBytes_ = 0;
  int files_ = 0;
  bool done_ = false;
  std::set<std::string> names_;
};

}  // namespace tessera::checkpoint
