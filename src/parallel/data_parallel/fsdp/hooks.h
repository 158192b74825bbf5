#pragma once
// Internal: the autograd pieces FSDP attaches (hooks.cpp).
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

namespace torch::autograd {
struct Node;
}

namespace tessera {
namespace fsdp {

// fwd: identity on `outs` (those requiring grad) / bwd: calls fsdp.onPreBackward(unit)
// (re-gather before the unit's backward), then passes the gradients through.
std::vector<at::Tensor> attachPreBackward(FullyShardedDataParallel::Impl& fsdp, int unit, const std::vector<at::Tensor>& outs);

// Registers a post hook on the gradient accumulator of `param` (a leaf requiring grad) that
// calls fsdp.onGradReady(unit, index). Returns (accumulator, key) for removal.
std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t> addGradReadyHook(FullyShardedDataParallel::Impl& fsdp,
                                                                              int unit, int index,
                                                                              const at::Tensor& param,
                                                                              const std::string& name);

}  // namespace fsdp
}  // namespace tessera
