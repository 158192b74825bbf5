// The experts' forward GEMMs in FP8 (grouped.h: fp8GroupedLinear).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/compat.h"
#include "kernels/fp8.h"
#include "models/moe/grouped.h"
#include "parallel/tensor/fp8_weight_cache.h"

namespace tessera::models::moe_detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// w [El, out, in] as E4M3 codes [El · out, in] with one factor per output feature of each expert:
// from the step's cache under `key` when one is open (fp8_weight_cache.h), else cast now.
kernels::Fp8Codes weightCodes(const at::Tensor& w, const at::Tensor& key) {
  const auto use = tp::detail::WeightUse::RowsForward;
  if (key.defined()) {
    if (auto hit = tp::detail::cachedWeight(key, use)) return *hit;
  }
  at::NoGradGuard ng;
  auto q = kernels::fp8Quantize(w.detach().reshape({-1, w.size(2)}), fp8::Format::E4M3, fp8::Axis::Rows);
  if (key.defined()) tp::detail::keepWeight(key, use, q);
  return q;
}

struct Fp8GroupedLinear : torch::autograd::Function<Fp8GroupedLinear> {
  // key by pointer: not an input of the function (no autograd edge to the parameter), read here only.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                            const at::Tensor* key) {
    const auto qx = kernels::fp8Quantize(x, fp8::Format::E4M3, fp8::Axis::Rows);
    const auto qw = weightCodes(w, *key);
    const int64_t el = w.size(0), out = w.size(1), in = w.size(2);
    auto y = compat::scaledGroupedMm(qx.codes, qx.scaleInv, qw.codes.view({el, out, in}), qw.scaleInv.view({el, out}),
                                     offs, x.scalar_type(), /*fastAccum=*/true);
    ctx->save_for_backward({x, w, offs});
    return y;
  }

  // The bf16 grouped path's backward: the input gradient and the weight gradient in bf16 grouped GEMMs
  // with float32 accumulation. The weight gradient is computed as [El, out, in] (gyᵀ · x), w's own
  // layout: a transposed [El, in, out] result cost a strided copy of the whole gradient (0.8 ms per
  // OLMoE expert matrix on an H200) when autograd cast it to the float32 master.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &offs = saved[2];
    const auto gy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) gx = compat::groupedMm(gy, w, offs);
    if (ctx->needs_input_grad(1)) gw = compat::groupedMm(gy.t(), x, offs);
    return {gx, gw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8GroupedLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs, const at::Tensor& key) {
  return Fp8GroupedLinear::apply(x, w, offs, &key);
}

}  // namespace tessera::models::moe_detail
