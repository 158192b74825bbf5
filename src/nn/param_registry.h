#pragma once
// Internal (src/nn): ParamRegistry<V>, a process-wide map from a tensor (its TensorImpl) to a value V
// that converts to bool (a std::function): set() with an empty V erases the entry, get() returns an
// empty V where there is none. Thread-safe; entries are keyed by address, so whoever sets an entry
// removes it before the tensor dies (the sinks of accum_embedding.h and grad_sink.h).
#include <ATen/core/Tensor.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace tessera::nn::detail {

template <typename V>
class ParamRegistry {
 public:
  void set(const at::Tensor& t, V v) {
    std::lock_guard<std::mutex> lock(mu_);
    if (v) {
      map_[t.unsafeGetTensorImpl()] = std::move(v);
    } else {
      map_.erase(t.unsafeGetTensorImpl());
    }
  }
  V get(const at::Tensor& t) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(t.unsafeGetTensorImpl());
    return it == map_.end() ? V() : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<const c10::TensorImpl*, V> map_;
};

}  // namespace tessera::nn::detail
