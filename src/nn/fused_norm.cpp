// RMSNorm / LayerNorm autograd ops over kernels/norm.h (contract in fused_norm.h).
#include "nn/fused_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/autocast.h"
#include "kernels/norm.h"

namespace tessera::nn {
namespace {

using kernels::NormKind;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct NormOp : torch::autograd::Function<NormOp> {
  // bias is optional: an undefined tensor may not be an input of a custom Function in 1.13.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, int64_t kind, double eps, c10::ScalarType outDtype) {
    const auto k = static_cast<NormKind>(kind);
    auto out = kernels::normForward(k, x, weight, bias.value_or(at::Tensor()), eps, outDtype);
    ctx->save_for_backward({x, weight, out.mean.defined() ? out.mean : out.rstd, out.rstd});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["bias"] = bias.has_value() ? c10::IValue(bias->scalar_type()) : c10::IValue();
    return out.y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto k = static_cast<NormKind>(ctx->saved_data["kind"].toInt());
    const auto biasType = ctx->saved_data["bias"];
    const at::Tensor& x = saved[0];
    auto g = kernels::normBackward(k, grads[0], x, saved[1],
                                   k == NormKind::Layer ? saved[2] : at::Tensor(), saved[3], !biasType.isNone());
    at::Tensor gb = biasType.isNone() ? at::Tensor() : g.gb.to(biasType.toScalarType());
    return {g.gx, g.gw, gb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

c10::ScalarType outputDtype(const at::Tensor& x) {
  const auto ac = currentCudaAutocast();
  return ac.enabled && x.is_cuda() ? ac.dtype : x.scalar_type();
}

at::Tensor norm(NormKind kind, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  const auto xc = x.contiguous();
  return NormOp::apply(xc, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                       static_cast<int64_t>(kind), eps, outputDtype(xc));
}

}  // namespace

at::Tensor rmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return norm(NormKind::Rms, x, weight, {}, eps);
}

at::Tensor layerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return norm(NormKind::Layer, x, weight, bias, eps);
}

}  // namespace tessera::nn
