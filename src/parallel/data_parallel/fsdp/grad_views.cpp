// FSDP's gradient shards seen through the caller's views of the master shards (setGradViews):
// the views' .grad are the truth an optimizer of the caller's reads and resets.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tessera/common/error.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"

namespace tessera {
namespace fsdp {

void adoptViewGrads(Unit& x) {
  if (x.gradViews.empty()) return;
  torch::NoGradGuard ng;
  bool any = false;
  for (const auto& [off, v] : x.gradViews) any = any || v.grad().defined();
  if (!any) {  // every view's .grad set to None: released, as zeroGrad
    x.grad = at::Tensor();
    return;
  }
  if (!x.grad.defined()) x.grad = at::zeros({x.layout.shardNumel}, x.master.options());
  for (const auto& [off, v] : x.gradViews) {
    auto range = x.grad.narrow(0, off, v.numel());
    const auto& g = v.grad();
    if (!g.defined()) {
      range.zero_();
    } else if (!(g.is_alias_of(x.grad) && g.data_ptr() == range.data_ptr())) {
      TESSERA_CHECK(g.numel() == v.numel(), "FullyShardedDataParallel: unit '{}': the .grad of the view at offset {} "
                    "has {} elements, the view {}", x.name, off, g.numel(), v.numel());
      range.copy_(g.reshape({-1}));
    }
  }
}

void publishViewGrads(Unit& x) {
  for (auto& [off, v] : x.gradViews) {
    v.mutable_grad() = x.grad.defined() ? x.grad.narrow(0, off, v.numel()).view(v.sizes()) : at::Tensor();
  }
}

}  // namespace fsdp

void FullyShardedDataParallel::Impl::setGradViews(size_t u, std::vector<std::pair<int64_t, at::Tensor>> views) {
  TESSERA_CHECK(u < units_.size(), "FullyShardedDataParallel::setGradViews: unit {} of {}", u, units_.size());
  auto& x = *units_[u];
  const auto* base = static_cast<const char*>(x.master.data_ptr());
  for (const auto& [off, v] : views) {
    TESSERA_CHECK(v.defined() && v.scalar_type() == at::kFloat && v.device() == x.master.device() && v.is_leaf() &&
                      off >= 0 && off + v.numel() <= x.layout.shardNumel &&
                      (v.numel() == 0 || v.data_ptr() == base + off * static_cast<int64_t>(sizeof(float))),
                  "FullyShardedDataParallel::setGradViews: unit '{}': the view at offset {} ({} elements) is not a "
                  "float32 leaf aliasing this rank's master shard of {} elements there",
                  x.name, off, v.defined() ? v.numel() : -1, x.layout.shardNumel);
  }
  adoptViewGrads(x);  // what the old views said
  x.gradViews = std::move(views);
  publishViewGrads(x);
}

}  // namespace tessera
