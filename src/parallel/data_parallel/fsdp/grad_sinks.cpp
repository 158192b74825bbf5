// FullyShardedDataParallel with accumulateGradInGemm: each trainable parameter's gradient sink
// (nn/grad_sink.h) is its range of the unit's float32 accumulation, allocated (zeroed) by the first
// gradient of a backward that needs it and consumed by the unit's reduce-scatter (backward.cpp).
#include <ATen/ATen.h>

#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"
#include "tessera/nn/grad_sink.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

namespace tessera {

void FullyShardedDataParallel::Impl::installGradSinks() {
  for (size_t u = 0; u < units_.size(); ++u) {
    auto& x = *units_[u];
    for (const auto& e : x.layout.entries) {
      if (!e.trainable) continue;
      nn::setGradSink(x.params[e.index], [this, u, offset = e.offset, numel = e.numel, shape = e.shape] {
        auto& y = *units_[u];
        if (!y.accum.defined()) y.accum = at::zeros({y.layout.paddedNumel}, y.master.options());
        return y.accum.narrow(0, offset, numel).view(shape);
      });
    }
  }
}

void FullyShardedDataParallel::Impl::removeGradSinks() {
  if (!opts_.accumulateGradInGemm) return;  // installed by the constructor exactly then
  for (auto& x : units_) {
    for (const auto& e : x->layout.entries) {
      if (e.trainable) nn::setGradSink(x->params[e.index], {});
    }
  }
}

}  // namespace tessera
