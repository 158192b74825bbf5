// RMSNorm / LayerNorm autograd ops over kernels/norm.h (contract in fused_norm.h).
#include "tessera/nn/fused_norm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tessera/common/autocast.h"
#include "kernels/add_norm.h"
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

// s = x + branch (branch optional: s is then x, returned as a view), y = norm(s).
struct AddNormOp : torch::autograd::Function<AddNormOp> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const c10::optional<at::Tensor>& branch,
                               const at::Tensor& weight, const c10::optional<at::Tensor>& bias, int64_t kind,
                               double eps, c10::ScalarType outDtype) {
    const auto k = static_cast<NormKind>(kind);
    auto out = kernels::addNormForward(k, x, branch.value_or(at::Tensor()), weight, bias.value_or(at::Tensor()), eps,
                                       outDtype);
    ctx->save_for_backward({out.s, weight, out.mean.defined() ? out.mean : out.rstd, out.rstd});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["bias"] = bias.has_value() ? c10::IValue(bias->scalar_type()) : c10::IValue();
    ctx->saved_data["branch"] = branch.has_value() ? c10::IValue(branch->scalar_type()) : c10::IValue();
    return {out.s, out.y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto k = static_cast<NormKind>(ctx->saved_data["kind"].toInt());
    const auto biasType = ctx->saved_data["bias"], branchType = ctx->saved_data["branch"];
    const c10::optional<c10::ScalarType> branchDtype =
        branchType.isNone() ? c10::nullopt : c10::optional<c10::ScalarType>(branchType.toScalarType());
    // Gradients of (s, y); autograd materialises an unused output's as zeros.
    auto g = kernels::addNormBackward(k, grads[1], grads[0], saved[0], saved[1],
                                      k == NormKind::Layer ? saved[2] : at::Tensor(), saved[3], !biasType.isNone(),
                                      branchDtype);
    at::Tensor gb = biasType.isNone() ? at::Tensor() : g.gb.to(biasType.toScalarType());
    return {g.gx, g.gbranch, g.gw, gb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

c10::ScalarType outputDtype(const at::Tensor& x, c10::ScalarType plain) {
  const auto ac = currentCudaAutocast();
  return ac.enabled && x.is_cuda() ? ac.dtype : plain;
}
c10::ScalarType outputDtype(const at::Tensor& x) { return outputDtype(x, x.scalar_type()); }

AddNormResult addNorm(NormKind kind, const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                      const at::Tensor& bias, double eps) {
  const auto xc = x.contiguous();
  const auto sType = branch.defined() ? at::result_type(xc, branch) : xc.scalar_type();
  auto out = AddNormOp::apply(xc, branch.defined() ? c10::optional<at::Tensor>(branch) : c10::nullopt, weight,
                              bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                              static_cast<int64_t>(kind), eps, outputDtype(xc, sType));
  return {out[0], out[1]};
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

AddNormResult addRmsNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight, double eps) {
  return addNorm(NormKind::Rms, x, branch, weight, {}, eps);
}

AddNormResult addLayerNorm(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                           const at::Tensor& bias, double eps) {
  return addNorm(NormKind::Layer, x, branch, weight, bias, eps);
}

}  // namespace tessera::nn
