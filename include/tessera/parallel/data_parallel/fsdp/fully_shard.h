#pragma once
// fullyShard: FSDP for a module of one's own without rewriting its forward. Every block of every
// nn::Blocks inside `module` (nn/blocks.h) becomes a unit, run inside its unit by the Blocks'
// wrapper; the module's other parameters (embeddings, final norm, head) form the root unit, kept
// gathered from forward to backward, around the whole forward (FullyShardedModule::forward).
// Collective over `group` like FullyShardedDataParallel's constructor (fsdp.h has the contract:
// every rank the same module; rank 0's values broadcast). The module must outlive the result.
// Example:
//   auto sharded = tessera::fullyShard(model, mesh.dataGroup(), {.paramDtype = at::kBFloat16});
//   tessera::ShardedAdamW opt(sharded.fsdp(), {.lr = 3e-4});
//   lossFn(sharded.forward(tokens), targets).backward();  // model->forward(tokens), sharded
//   opt.step();
//   opt.zeroGrad();
#include <memory>
#include <vector>

#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

namespace tessera {

template <class M>
class FullyShardedModule {
 public:
  FullyShardedModule(std::shared_ptr<M> module, std::unique_ptr<FullyShardedDataParallel> fsdp, int rootUnit)
      : module_(std::move(module)), fsdp_(std::move(fsdp)), root_(rootUnit) {}
  // module->forward(args...) inside the root unit (or as is when the module has no other parameters).
  template <class... Args>
  at::Tensor forward(Args&&... args) {
    if (root_ < 0) return module_->forward(std::forward<Args>(args)...);
    return fsdp_->runUnit(static_cast<size_t>(root_), std::vector<at::Tensor>{}, [&](const std::vector<at::Tensor>&) {
      return std::vector<at::Tensor>{module_->forward(std::forward<Args>(args)...)};
    })[0];
  }
  FullyShardedDataParallel& fsdp() { return *fsdp_; }
  const std::shared_ptr<M>& module() const { return module_; }

 private:
  std::shared_ptr<M> module_;
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
  int root_;
};

// The FSDP over `module`'s blocks and root (the root unit's index, -1 when it has no parameters).
std::pair<std::unique_ptr<FullyShardedDataParallel>, int> shardBlocks(torch::nn::Module& module, CommPtr group,
                                                                       FsdpOptions options);

template <class M>
FullyShardedModule<M> fullyShard(std::shared_ptr<M> module, CommPtr group, FsdpOptions options = {}) {
  auto [fsdp, root] = shardBlocks(*module, std::move(group), options);
  return FullyShardedModule<M>(std::move(module), std::move(fsdp), root);
}

}  // namespace tessera
