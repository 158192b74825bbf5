// Gradient sinks of parameters (contract in grad_sink.h).
#include "tessera/nn/grad_sink.h"

#include <c10/core/TensorImpl.h>

#include <mutex>
#include <unordered_map>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"

namespace tessera::nn {
namespace {
std::mutex gradSinkMu;
std::unordered_map<const c10::TensorImpl*, GradSink>& gradSinks() {
  static std::unordered_map<const c10::TensorImpl*, GradSink> s;
  return s;
}
GradSink gradSinkFor(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(gradSinkMu);
  auto it = gradSinks().find(param.unsafeGetTensorImpl());
  return it == gradSinks().end() ? GradSink() : it->second;
}
}  // namespace

void setGradSink(const at::Tensor& param, GradSink sink) {
  std::lock_guard<std::mutex> lock(gradSinkMu);
  if (sink) {
    gradSinks()[param.unsafeGetTensorImpl()] = std::move(sink);
  } else {
    gradSinks().erase(param.unsafeGetTensorImpl());
  }
}

bool hasGradSink(const at::Tensor& param) { return static_cast<bool>(gradSinkFor(param)); }

at::Tensor gradSinkOf(const at::Tensor& param) {
  auto sink = gradSinkFor(param);
  if (!sink) return {};
  auto t = sink();
  TESSERA_CHECK(t.defined() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == param.sizes() &&
                    t.device() == param.device(),
                "nn::gradSinkOf: the gradient sink of a parameter of shape {} gave {} {}{} on {}: it must be a "
                "contiguous float32 tensor of the parameter's shape on its device",
                c10::str(param.sizes()), t.defined() ? c10::str(t.sizes()) : "undefined",
                t.defined() ? dtypeName(t.scalar_type()) : "",
                t.defined() && !t.is_contiguous() ? " (not contiguous)" : "", t.defined() ? t.device().str() : "-");
  return t;
}

}  // namespace tessera::nn
