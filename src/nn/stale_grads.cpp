// Stale gradients (contract in stale_grads.h).
#include "tessera/nn/stale_grads.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <mutex>
#include <unordered_map>

namespace tessera::nn {
namespace {

std::mutex mu;
std::unordered_map<const c10::TensorImpl*, at::Tensor>& marks() {
  static std::unordered_map<const c10::TensorImpl*, at::Tensor> m;
  return m;
}

// The parameter of a mark, the mark removed; undefined when there was none.
at::Tensor take(const c10::TensorImpl* key) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = marks().find(key);
  if (it == marks().end()) return {};
  auto p = std::move(it->second);
  marks().erase(it);
  return p;
}

// Zeroes the tensors in place, in one multi-tensor launch where LibTorch has it.
void zeroAll(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return;
#if TORCH_VERSION_MAJOR >= 2
  at::_foreach_zero_(grads);
#else
  for (auto g : grads) g.zero_();
#endif
}

}  // namespace

void markStale(const std::vector<at::Tensor>& params) {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined()) marks()[p.unsafeGetTensorImpl()] = p;
  }
}

bool takeStale(const at::Tensor& param) {
  auto p = take(param.unsafeGetTensorImpl());
  return p.defined() && p.grad().defined();
}

void zeroIfStale(const c10::TensorImpl* param) {
  auto p = take(param);
  if (p.defined() && p.grad().defined()) p.mutable_grad().zero_();
}

void zeroIfStale(const at::Tensor& param) { zeroIfStale(param.unsafeGetTensorImpl()); }

void zeroIfStale(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& q : params) {
    auto p = take(q.unsafeGetTensorImpl());
    if (p.defined() && p.grad().defined()) grads.push_back(p.mutable_grad());
  }
  zeroAll(grads);
}

void zeroGrads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    take(p.unsafeGetTensorImpl());  // zeroed below: no longer stale
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  zeroAll(grads);
}

bool isStale(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(mu);
  return marks().count(param.unsafeGetTensorImpl()) > 0;
}

size_t staleCount() {
  std::lock_guard<std::mutex> lock(mu);
  return marks().size();
}

}  // namespace tessera::nn
