// Linear with fused float32 gradient accumulation (contract in accum_linear.h).
#include "tessera/nn/accum_linear.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "kernels/gemm_accumulate.h"
#include "tessera/comm/types.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/nn/grad_sink.h"
#include "tessera/nn/stale_grads.h"

namespace tessera::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AccumState : torch::CustomClassHolder {
  at::Tensor weight, bias;  // the parameters (leaves): their .grad is written
  at::Tensor wc, bc;        // the same in the compute dtype (autocast's cached casts, or themselves)
};

struct AccumLinear : torch::autograd::Function<AccumLinear> {
  // bias is optional: an undefined tensor may not be an input of a custom Function in 1.13.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, c10::intrusive_ptr<AccumState> st) {
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return at::linear(x, st->wc, st->bc.defined() ? c10::optional<at::Tensor>(st->bc) : c10::nullopt);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto st = c10::static_intrusive_pointer_cast<AccumState>(ctx->saved_data["state"].toCapsule());
    const int64_t out = st->wc.size(0), in = st->wc.size(1);
    auto gy = grads[0].to(x.scalar_type()).reshape({-1, out}).contiguous();
    at::Tensor gx;
    if (ctx->needs_input_grad(0)) gx = gy.mm(st->wc).view(x.sizes());
    if (st->weight.requires_grad()) accumulateWeightGrad(st->weight, gy, x.reshape({-1, in}));
    if (st->bias.defined() && st->bias.requires_grad()) accumulateBiasGrad(st->bias, gy);
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void checkAccumulatable(const char* op, const char* what, const at::Tensor& p) {
  if (hasGradSink(p)) {  // grad_sink.h: summed into the sink's float32 tensor, whatever p's dtype
    TESSERA_CHECK(p.is_leaf(), "{}: the {} ({}) has a gradient sink but is not a leaf tensor (a parameter)", op, what,
                  c10::str(p.sizes()));
    return;
  }
  TESSERA_CHECK(p.scalar_type() == at::kFloat && p.is_leaf(),
                "{}: the {} must be a float32 leaf tensor (a parameter) to sum its gradient in the GEMM; got {} {}{}",
                op, what, c10::str(p.sizes()), dtypeName(p.scalar_type()), p.is_leaf() ? "" : ", not a leaf");
  const auto& g = p.grad();
  TESSERA_CHECK(!g.defined() || (g.scalar_type() == at::kFloat && g.is_contiguous() && g.sizes() == p.sizes()),
                "{}: the {}'s .grad must be a contiguous float32 tensor of its shape {} to accumulate into; it is {} "
                "{}{}",
                op, what, c10::str(p.sizes()), c10::str(g.sizes()), dtypeName(g.scalar_type()),
                g.is_contiguous() ? "" : " (not contiguous)");
}

namespace {
void accumulateWeightGradNow(const at::Tensor& weight, const at::Tensor& gy, const at::Tensor& x) {
  if (auto sink = gradSinkOf(weight); sink.defined()) {
    kernels::gemmAccumulateTN(sink, gy.contiguous(), x.contiguous(), /*overwrite=*/false);
    return;
  }
  if (takeStale(weight)) {  // stale_grads.h: the product replaces what .grad holds (beta = 0)
    kernels::gemmAccumulateTN(weight.grad(), gy.contiguous(), x.contiguous(), /*overwrite=*/true);
    return;
  }
  kernels::gemmAccumulateTNInto(weight.mutable_grad(), weight.sizes(), weight.device(), gy.contiguous(),
                                x.contiguous());
}

// A column of ones of at least k rows in `dtype` on `device`, for row sums as GEMMs. Cached per
// thread (autograd runs backward on one thread per device) and never freed: a kernel queued on
// any stream may still read an older one.
at::Tensor onesColumn(int64_t k, c10::ScalarType dtype, const at::Device& device) {
  thread_local std::vector<at::Tensor> cache;
  for (auto it = cache.rbegin(); it != cache.rend(); ++it)
    if (it->scalar_type() == dtype && it->device() == device && it->size(0) >= k) return it->narrow(0, 0, k);
  cache.push_back(at::ones({std::max<int64_t>(k, 1 << 16), 1}, at::TensorOptions().dtype(dtype).device(device)));
  return cache.back().narrow(0, 0, k);
}

void accumulateBiasGradNow(const at::Tensor& bias, const at::Tensor& gy) {
  at::Tensor sink = gradSinkOf(bias);  // grad_sink.h: added into, never replaced
  at::Tensor& g = sink.defined() ? sink : bias.mutable_grad();
  const auto dt = gy.scalar_type();
  const bool stale = !sink.defined() && takeStale(bias);  // stale_grads.h: replace .grad instead of adding to it
  if (gy.is_cuda() && gy.dim() == 2 && (dt == at::kBFloat16 || dt == at::kHalf)) {
    // Σ over rows as one GEMM summing in float32 straight into .grad (gyᵀ · 1, beta = 1): one
    // kernel instead of a reduction and an add (800 of each per step of a 16-micro-batch pipeline).
    const bool fresh = !g.defined();
    if (fresh) g = at::empty(bias.sizes(), at::TensorOptions().dtype(at::kFloat).device(bias.device()));
    kernels::gemmAccumulateTN(g.view({-1, 1}), gy.contiguous(), onesColumn(gy.size(0), dt, gy.device()),
                              fresh || stale);
    return;
  }
  auto sum = at::sum(gy, {0}, /*keepdim=*/false, at::kFloat);
  if (stale) {
    g.copy_(sum);
  } else if (g.defined()) {
    g.add_(sum);
  } else {
    g = sum;
  }
}
}  // namespace

// Inside a split backward's B these only record their work for W (nn/deferred_grads.h).
void accumulateWeightGrad(const at::Tensor& weight, const at::Tensor& gy, const at::Tensor& x) {
  if (auto* q = deferringWeightGrads()) return q->push([weight, gy, x] { accumulateWeightGradNow(weight, gy, x); });
  accumulateWeightGradNow(weight, gy, x);
}

void accumulateBiasGrad(const at::Tensor& bias, const at::Tensor& gy) {
  if (auto* q = deferringWeightGrads()) return q->push([bias, gy] { accumulateBiasGradNow(bias, gy); });
  accumulateBiasGradNow(bias, gy);
}

at::Tensor linearAccumulateGrad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TESSERA_CHECK(x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
                    (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0))),
                "nn::linearAccumulateGrad: needs x [..., in], weight [out, in] and bias [out] or none; got x {}, "
                "weight {}, bias {}",
                x.defined() ? c10::str(x.sizes()) : "undefined", weight.defined() ? c10::str(weight.sizes()) : "undefined",
                bias.defined() ? c10::str(bias.sizes()) : "none");
  const bool grads = at::GradMode::is_enabled() &&
                     (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  auto st = c10::make_intrusive<AccumState>();
  st->weight = weight;
  st->bias = bias;
  // The casts happen here, under grad mode, so autocast's cache holds what at::linear would put there.
  st->wc = castParamForCudaAutocast(weight);
  if (bias.defined()) st->bc = castParamForCudaAutocast(bias);
  const auto xc = castForCudaAutocast(x);
  if (!grads) return at::linear(xc, st->wc, bias.defined() ? c10::optional<at::Tensor>(st->bc) : c10::nullopt);
  if (weight.requires_grad()) checkAccumulatable("nn::linearAccumulateGrad", "weight", weight);
  if (bias.defined() && bias.requires_grad()) checkAccumulatable("nn::linearAccumulateGrad", "bias", bias);
  st->wc = st->wc.detach();  // the backward needs the casts' values only
  if (st->bc.defined()) st->bc = st->bc.detach();
  return AccumLinear::apply(xc, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, st);
}

}  // namespace tessera::nn
