// SwiGLU and bias + GELU autograd ops over kernels/activations.h (contract in fused_activations.h).
#include "tessera/nn/fused_activations.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "kernels/activations.h"
#include "tessera/nn/accum_linear.h"

namespace tessera::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwigluOp : torch::autograd::Function<SwigluOp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    return kernels::swigluForward(h);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {kernels::swigluBackward(grads[0], ctx->get_saved_variables()[0])};
  }
};

struct BiasGeluOp : torch::autograd::Function<BiasGeluOp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& bias) {
    ctx->save_for_backward({h, bias});
    return kernels::biasGeluForward(h, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = kernels::biasGeluBackward(grads[0], saved[0], saved[1]);
    return {g.gh, g.gb.to(saved[1].scalar_type())};
  }
};

struct SwigluLinearState : torch::CustomClassHolder {
  at::Tensor weight;  // the parameter
  at::Tensor wc;      // its compute-dtype cast (autocast's cached cast, or itself), detached
  bool accumulate = false;
};

struct SwigluLinearOp : torch::autograd::Function<SwigluLinearOp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            c10::intrusive_ptr<SwigluLinearState> st) {
    ctx->save_for_backward({h});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return at::linear(kernels::swigluForward(h), st->wc);  // the product dies here
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    auto st = c10::static_intrusive_pointer_cast<SwigluLinearState>(ctx->saved_data["state"].toCapsule());
    const int64_t out = st->wc.size(0), f = st->wc.size(1);
    auto gy = grads[0].to(h.scalar_type()).reshape({-1, out}).contiguous();
    auto p = kernels::swigluForward(h).reshape({-1, f});  // recomputed
    at::Tensor gw;
    if (st->weight.requires_grad()) {
      if (st->accumulate) {
        accumulateWeightGrad(st->weight, gy, p);
      } else {
        gw = gy.t().mm(p).to(st->weight.scalar_type());
      }
    }
    at::Tensor gh;
    if (ctx->needs_input_grad(0)) {
      auto shape = h.sizes().vec();
      shape.back() = f;
      gh = kernels::swigluBackward(gy.mm(st->wc).view(shape), h);
    }
    return {gh, gw, at::Tensor()};
  }
};

}  // namespace

at::Tensor swigluLinear(const at::Tensor& h, const at::Tensor& weight, bool accumulateGrad) {
  TESSERA_CHECK(h.defined() && weight.defined() && weight.dim() == 2 && h.dim() >= 1 &&
                    h.size(-1) == 2 * weight.size(1),
                "nn::swigluLinear: needs h [..., 2F] and weight [out, F]; got h {}, weight {}",
                h.defined() ? c10::str(h.sizes()) : "undefined", weight.defined() ? c10::str(weight.sizes()) : "undefined");
  auto st = c10::make_intrusive<SwigluLinearState>();
  st->weight = weight;
  st->accumulate = accumulateGrad;
  st->wc = castParamForCudaAutocast(weight);  // under grad mode: autocast's cache holds it as at::linear's would
  const auto hc = castForCudaAutocast(h).contiguous();
  const bool grads = at::GradMode::is_enabled() && (h.requires_grad() || weight.requires_grad());
  if (!grads) return at::linear(kernels::swigluForward(hc), st->wc);
  if (accumulateGrad && weight.requires_grad()) checkAccumulatable("nn::swigluLinear", "weight", weight);
  st->wc = st->wc.detach();
  return SwigluLinearOp::apply(hc, weight, st);
}

at::Tensor swiglu(const at::Tensor& h) { return SwigluOp::apply(h.contiguous()); }

at::Tensor biasGelu(const at::Tensor& h, const at::Tensor& bias) { return BiasGeluOp::apply(h.contiguous(), bias); }

}  // namespace tessera::nn
