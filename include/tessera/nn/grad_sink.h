#pragma once
// nn::setGradSink: where the weight-gradient GEMMs that sum in float32 (accum_linear.h, the tensor-
// parallel and FP8 linears with accumulateGradInGemm, swigluLinear) add a parameter's gradient
// instead of its .grad. The sink is a provider, called in backward each time a gradient is to be
// added, returning a float32 contiguous tensor of the parameter's shape (read and added into: beta 1,
// never overwritten). For a wrapper whose parameters are views of a bf16 buffer (FSDP with
// FsdpOptions::accumulateGradInGemm), whose .grad could only be bf16. A parameter with a sink passes
// checkAccumulatable whatever its dtype (it must be a leaf). Local; process-wide, thread-safe, keyed by
// the parameter's TensorImpl; whoever installs a sink removes it (an empty provider). A provider
// returning a tensor of another dtype or shape is a tessera::Error naming the parameter's shape.
#include <ATen/core/Tensor.h>

#include <functional>

namespace tessera::nn {

using GradSink = std::function<at::Tensor()>;
void setGradSink(const at::Tensor& param, GradSink sink);
bool hasGradSink(const at::Tensor& param);
// The sink's tensor now (checked), or undefined where `param` has none.
at::Tensor gradSinkOf(const at::Tensor& param);

}  // namespace tessera::nn
