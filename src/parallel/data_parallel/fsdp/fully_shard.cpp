// fullyShard's units: one per block of every nn::Blocks of the module, the rest in the root unit.
#include "tessera/parallel/data_parallel/fsdp/fully_shard.h"

#include <fmt/format.h>

#include <set>

#include "tessera/common/error.h"
#include "tessera/nn/blocks.h"

namespace tessera {

std::pair<std::unique_ptr<FullyShardedDataParallel>, int> shardBlocks(torch::nn::Module& module, CommPtr group,
                                                                       FsdpOptions options) {
  std::vector<FsdpUnitSpec> units;
  std::vector<std::pair<nn::BlocksImpl*, size_t>> lists;  // each Blocks and the unit of its first block
  std::set<const void*> inBlocks;
  for (const auto& item : module.named_modules()) {
    auto* blocks = dynamic_cast<nn::BlocksImpl*>(item.value().get());
    if (!blocks) continue;
    lists.emplace_back(blocks, units.size());
    for (size_t i = 0; i < blocks->size(); ++i) {
      FsdpUnitSpec u;
      u.name = fmt::format("{}.{}", item.key().empty() ? "blocks" : item.key(), i);
      for (const auto& p : blocks->ptr(i)->named_parameters()) {
        u.params.emplace_back(u.name + "." + p.key(), p.value());  // the module's own name for it
        inBlocks.insert(p.value().unsafeGetTensorImpl());
      }
      units.push_back(std::move(u));
    }
  }
  TESSERA_CHECK(!lists.empty(), "fullyShard: the module holds no tessera::nn::Blocks (its blocks become the units)");
  FsdpUnitSpec root{"root", {}, false, {}};
  for (const auto& p : module.named_parameters()) {
    if (!inBlocks.count(p.value().unsafeGetTensorImpl())) root.params.emplace_back(p.key(), p.value());
  }
  const int rootUnit = root.params.empty() ? -1 : static_cast<int>(units.size());
  if (rootUnit >= 0) units.push_back(std::move(root));
  auto fsdp = std::make_unique<FullyShardedDataParallel>(std::move(units), std::move(group), options);
  for (auto& [blocks, first] : lists) {
    blocks->setAround([f = fsdp.get(), first = first](size_t i, const at::Tensor& x, const nn::BlocksImpl::Fn& fn) {
      return f->runUnit(first + i, x, fn);
    });
  }
  return {std::move(fsdp), rootUnit};
}

}  // namespace tessera
