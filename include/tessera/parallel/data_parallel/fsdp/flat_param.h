#pragma once
// FlatLayout: where each parameter of one FSDP unit lives in the unit's flat buffer, and
// storage helpers that free / re-allocate a flat buffer in place.
//
// Layout: trainable parameters first (in the order given), then frozen ones (requires_grad
// false), then zero padding up to a multiple of the shard count, so that the buffer splits
// into `shards` equal shards and the trainable elements of every shard form a prefix of it
// (the sharded optimizer steps that prefix only). Everything here is local.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::fsdp {

struct FlatEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // element offset in the flat buffer
  int64_t numel = 0;
  bool trainable = true;
  int index = 0;  // position in the unit's parameter list as given
};

struct FlatLayout {
  std::vector<FlatEntry> entries;  // in flat order: trainable, then frozen
  int64_t numel = 0;               // sum of the entries' numel
  int64_t trainableNumel = 0;      // [0, trainableNumel) holds the trainable parameters
  int64_t paddedNumel = 0;         // numel rounded up to a multiple of shards (at least shards)
  int64_t shardNumel = 0;          // paddedNumel / shards
  int shards = 1;

  // Number of elements at the start of shard r that belong to trainable parameters.
  int64_t trainableInShard(int r) const;
};

// names[i] / params[i]: the unit's parameters (their shape and requires_grad are read).
FlatLayout makeLayout(const std::vector<std::string>& names, const std::vector<at::Tensor>& params, int shards);

// Storage of `t` (and of every view sharing it): released (data pointer null, 0 bytes) or
// re-allocated with `nbytes` from the storage's own allocator (CPU, or CUDA's caching
// allocator on the current stream); contents are undefined after allocation. Views keep
// their sizes and offsets, so they see the new memory: this is how unit parameters, which
// stay views of the unit's flat buffer, are freed when resharded and valid again when
// gathered, including the copies autograd saved for backward.
void freeStorage(const at::Tensor& t);
void allocateStorage(const at::Tensor& t, size_t nbytes);
bool storageAllocated(const at::Tensor& t);

}  // namespace tessera::fsdp
