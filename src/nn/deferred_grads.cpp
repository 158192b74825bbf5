// Deferred weight gradients (contract in deferred_grads.h).
#include "tessera/nn/deferred_grads.h"

#include <ATen/core/grad_mode.h>

#include <atomic>

#include "tessera/common/error.h"

namespace tessera::nn {
namespace {
std::atomic<WeightGradQueue*> open{nullptr};
}  // namespace

void WeightGradQueue::run() {
  at::NoGradGuard asInBackward;  // the work was recorded inside autograd's backward, grad mode off
  auto work = std::move(work_);
  work_.clear();
  for (auto& w : work) w();
}

DeferWeightGrads::DeferWeightGrads(WeightGradQueue& into) {
  WeightGradQueue* none = nullptr;
  TESSERA_CHECK(open.compare_exchange_strong(none, &into),
                "nn::DeferWeightGrads: a scope deferring weight gradients is already open (one backward at a time "
                "defers)");
}

DeferWeightGrads::~DeferWeightGrads() { open.store(nullptr); }

WeightGradQueue* deferringWeightGrads() { return open.load(); }

}  // namespace tessera::nn
