// SwiGLU and bias + GELU autograd ops over kernels/activations.h (contract in fused_activations.h).
#include "nn/fused_activations.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/activations.h"

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

}  // namespace

at::Tensor swiglu(const at::Tensor& h) { return SwigluOp::apply(h.contiguous()); }

at::Tensor biasGelu(const at::Tensor& h, const at::Tensor& bias) { return BiasGeluOp::apply(h.contiguous(), bias); }

}  // namespace tessera::nn
