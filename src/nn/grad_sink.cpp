// Gradient sinks of parameters (contract in grad_sink.h).
#include "tessera/nn/grad_sink.h"

#include <utility>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"
#include "nn/param_registry.h"

namespace tessera::nn {
namespace {
detail::ParamRegistry<GradSink>& gradSinks() {
  static detail::ParamRegistry<GradSink> r;
  return r;
}
}  // namespace

void setGradSink(const at::Tensor& param, GradSink sink) { gradSinks().set(param, std::move(sink)); }

bool hasGradSink(const at::Tensor& param) { return static_cast<bool>(gradSinks().get(param)); }

at::Tensor gradSinkOf(const at::Tensor& param) {
  auto sink = gradSinks().get(param);
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
