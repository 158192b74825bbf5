#include "tessera/parallel/data_parallel/fsdp/flat_param.h"

#include <c10/core/StorageImpl.h>

#include <algorithm>

#include "tessera/common/error.h"

namespace tessera::fsdp {

int64_t FlatLayout::trainableInShard(int r) const {
  return std::clamp<int64_t>(trainableNumel - static_cast<int64_t>(r) * shardNumel, 0, shardNumel);
}

FlatLayout makeLayout(const std::vector<std::string>& names, const std::vector<at::Tensor>& params, int shards) {
  TESSERA_CHECK(shards >= 1, "FSDP: shard count {} must be positive", shards);
  FlatLayout l;
  l.shards = shards;
  for (int pass = 0; pass < 2; ++pass) {  // trainable first, then frozen
    for (size_t i = 0; i < params.size(); ++i) {
      const bool trainable = params[i].requires_grad();
      if (trainable != (pass == 0)) continue;
      FlatEntry e;
      e.name = names[i];
      e.shape = params[i].sizes().vec();
      e.offset = l.numel;
      e.numel = params[i].numel();
      e.trainable = trainable;
      e.index = static_cast<int>(i);
      l.numel += e.numel;
      if (trainable) l.trainableNumel += e.numel;
      l.entries.push_back(std::move(e));
    }
  }
  l.shardNumel = std::max<int64_t>(1, (l.numel + shards - 1) / shards);
  l.paddedNumel = l.shardNumel * shards;
  return l;
}

void freeStorage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocateStorage(const at::Tensor& t, size_t nbytes) {
  auto* s = t.storage().unsafeGetStorageImpl();
  TESSERA_CHECK(s->allocator() != nullptr, "FSDP: flat buffer on {} has no allocator", t.device().str());
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

bool storageAllocated(const at::Tensor& t) { return t.storage().nbytes() > 0; }

}  // namespace tessera::fsdp
