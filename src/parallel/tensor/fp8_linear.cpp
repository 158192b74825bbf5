// The tensor-parallel linears' FP8 GEMMs on codes (contract in fp8_linear.h).
#include "parallel/tensor/fp8_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/fp8.h"
#include "kernels/gemm_accumulate.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "tessera/common/error.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/nn/grad_sink.h"
#include "tessera/nn/stale_grads.h"

namespace tessera::tp {
namespace {

using fp8::Axis;
using fp8::Format;
using kernels::fp8Gemm;
using kernels::fp8Quantize;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Fp8State : torch::CustomClassHolder {
  explicit Fp8State(Fp8LinearSpec s) : spec(std::move(s)) {}
  Fp8LinearSpec spec;
  at::Tensor weight, bias;  // the parameters (backward recasts W; accumulateGrad sums into .grad)
  at::Tensor wAmax;         // tensorwise: the forward's amax of W, for backward's recast
  bool tensorwise() const { return spec.recipe == fp8::Recipe::Tensorwise; }
};

// t's rows from every rank of c in rank order ([m, ...] → [p·m, ...]). FP8 codes travel as byte
// pairs (NCCL moves bytes; the communicator takes float types).
at::Tensor gatherRows(const at::Tensor& t, const CommPtr& c) {
  if (c->size() == 1) return t;
  auto in = t.contiguous();
  const bool bytes = in.scalar_type() == at::kByte;
  TESSERA_CHECK(!bytes || (in.dim() == 2 && in.size(1) % 2 == 0),
                "fp8 linear (rank {} of tp {}): FP8 codes of {} columns cannot be gathered in byte pairs", c->rank(),
                c->size(), in.dim() == 2 ? in.size(1) : -1);
  auto send = bytes ? in.view(at::kBFloat16) : in;
  auto sizes = send.sizes().vec();
  sizes[0] *= c->size();
  auto out = at::empty(sizes, send.options());
  c->allGather(out, send)->wait();
  return bytes ? out.view(at::kByte) : out;
}

void allReduceIfShared(const at::Tensor& t, const CommPtr& c) {
  if (c->size() > 1) c->allReduce(t)->wait();
}

at::Tensor reduceScatterRows(const at::Tensor& full, const CommPtr& c) {
  auto sizes = full.sizes().vec();
  sizes[0] /= c->size();
  auto out = at::empty(sizes, full.options());
  c->reduceScatter(out, full)->wait();
  return out;
}

// gW [out, in] = gyᵀ x from FP8 codes (gyT [out, m] E5M2, xT [in, m] E4M3): summed into
// into.grad (the weight, float32; deferred inside a DeferWeightGrads scope) when `into` is
// defined, else returned in wdtype.
at::Tensor weightGradFp8(const at::Tensor& into, const at::Tensor& gyT, const at::Tensor& gInv, const at::Tensor& xT,
                         const at::Tensor& xInv, at::ScalarType wdtype) {
  if (!into.defined()) return fp8Gemm(gyT, gInv, Format::E5M2, xT, xInv, Format::E4M3, at::kFloat).to(wdtype);
  auto run = [w = into, gyT, gInv, xT, xInv] {
    kernels::Fp8GemmOptions o;
    if (o.accumulate = nn::gradSinkOf(w); o.accumulate.defined()) {  // nn/grad_sink.h: added into
      fp8Gemm(gyT, gInv, Format::E5M2, xT, xInv, Format::E4M3, at::kFloat, o);
      return;
    }
    const bool stale = nn::takeStale(w);  // nn/stale_grads.h: then the product replaces .grad
    auto& g = w.mutable_grad();
    o.accumulate = g;
    o.overwrite = stale;
    auto r = fp8Gemm(gyT, gInv, Format::E5M2, xT, xInv, Format::E4M3, at::kFloat, o);
    if (!g.defined()) g = r;
  };
  if (auto* q = nn::deferringWeightGrads()) {
    q->push(run);
  } else {
    run();
  }
  return {};
}

// The same in the input precision (rowwise's weight gradient).
at::Tensor weightGradHigh(const at::Tensor& into, const at::Tensor& gy, const at::Tensor& x, at::ScalarType wdtype) {
  if (into.defined()) {
    nn::accumulateWeightGrad(into, gy, x);
    return {};
  }
  return kernels::weightGradTN(gy, x, wdtype);
}

// W's codes for `use`: the step's cache's (fp8_weight_cache.h), or `make()`'s, kept for the step.
template <typename Make>
kernels::Fp8Codes weightCodes(const at::Tensor& weight, detail::WeightUse use, Make&& make) {
  if (auto hit = detail::cachedWeight(weight, use)) return *hit;
  auto codes = make();
  detail::keepWeight(weight, use, codes);
  return codes;
}

kernels::Fp8QuantizeOptions opts(bool codes, bool transposed, const CommPtr& over, const at::Tensor& amax = {}) {
  kernels::Fp8QuantizeOptions o;
  o.codes = codes;
  o.transposed = transposed;
  o.amaxOver = over;
  o.amax = amax;
  return o;
}

struct Fp8Linear : torch::autograd::Function<Fp8Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, c10::intrusive_ptr<Fp8State> st) {
    const auto& c = st->spec.tp;
    const bool column = st->spec.kind == Fp8Parallel::Column, sp = st->spec.sequenceParallel;
    const auto dt = x.scalar_type();
    const int64_t in = weight.size(1), out = weight.size(0);
    const auto x2 = x.reshape({-1, in}).contiguous();
    // Amaxes over tp where the tensor is split along what the amax runs over (fp8_linear.h).
    const CommPtr xOver = column ? (sp && st->tensorwise() ? c : nullptr) : c;
    const Axis axis = st->tensorwise() ? Axis::Tensor : Axis::Rows;
    const bool keepXT = st->tensorwise() && !(column && sp);
    auto qx = fp8Quantize(x2, Format::E4M3, axis, opts(true, keepXT, xOver));
    // W's codes: from the step's cache (fp8_weight_cache.h), or cast now; with a cache open,
    // tensorwise writes their transpose too, for every backward of the step.
    const auto use = st->tensorwise() ? detail::WeightUse::Tensorwise : detail::WeightUse::RowsForward;
    const auto qw = weightCodes(weight, use, [&] {
      const bool both = st->tensorwise() && detail::weightCacheOpen();
      return fp8Quantize(weight, Format::E4M3, axis, opts(true, both, column && !st->tensorwise() ? nullptr : c));
    });
    st->wAmax = qw.amax;
    at::Tensor a = qx.codes, aInv = qx.scaleInv;
    if (column && sp) {
      a = gatherRows(qx.codes, c);
      if (!st->tensorwise()) aInv = gatherRows(qx.scaleInv, c);
    }
    kernels::Fp8GemmOptions fast;
    fast.fastAccum = true;
    auto y = fp8Gemm(a, aInv, Format::E4M3, qw.codes, qw.scaleInv, Format::E4M3, dt, fast);
    if (bias && (column || c->rank() == 0)) y.add_(bias->to(dt));  // row: once, before the sum
    if (!column) y = sp ? reduceScatterRows(y, c) : (allReduceIfShared(y, c), y);
    // Saved: tensorwise xᵀ's codes (column + sp: this rank's codes, gathered again in backward);
    // rowwise x itself (its weight gradient is not FP8).
    if (st->tensorwise()) {
      ctx->save_for_backward({keepXT ? qx.codesT : qx.codes, qx.scaleInv});
    } else {
      ctx->save_for_backward({x2, at::Tensor()});
    }
    st->weight = weight;
    if (bias) st->bias = *bias;
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["xdtype"] = dt;
    ctx->saved_data["xshape"] = x.sizes().vec();
    auto shape = x.sizes().vec();
    shape[0] = y.size(0) / (x2.size(0) / x.size(0));
    shape.back() = out;
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<Fp8State>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    const auto& c = st->spec.tp;
    const bool column = st->spec.kind == Fp8Parallel::Column, sp = st->spec.sequenceParallel;
    const bool into = st->spec.accumulateGrad;
    const bool needX = ctx->needs_input_grad(0), needW = ctx->needs_input_grad(1);
    const bool needB = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    const auto dt = ctx->saved_data["xdtype"].toScalarType();
    const auto xshape = ctx->saved_data["xshape"].toIntVector();
    const at::Tensor& weight = st->weight;
    const auto wdtype = weight.scalar_type();
    const int64_t out = weight.size(0);
    const auto gy = grads[0].reshape({-1, out}).to(dt).contiguous();
    const at::Tensor intoGrad = into ? weight : at::Tensor();  // weight gradients: into .grad, or returned

    at::Tensor gx, gw, gb;
    if (st->tensorwise()) {
      // gy E5M2 per tensor: its columns are split over tp (column) or its token rows (row + sp).
      const CommPtr gOver = column || sp ? c : nullptr;
      const bool gyT = needW && (column || !sp);
      auto qg = fp8Quantize(gy, Format::E5M2, Axis::Tensor, opts(true, gyT, gOver));
      at::Tensor g = qg.codes, gT = qg.codesT;
      if (!column && sp) {
        g = gatherRows(qg.codes, c);
        if (needW) gT = g.t().contiguous();
      }
      if (needX) {
        auto hit = detail::cachedWeight(weight, detail::WeightUse::Tensorwise);
        auto wt = hit && hit->codesT.defined()
                      ? *hit
                      : fp8Quantize(weight, Format::E4M3, Axis::Tensor, opts(false, true, nullptr, st->wAmax));
        gx = fp8Gemm(g, qg.scaleInv, Format::E5M2, wt.codesT, wt.scaleInv, Format::E4M3, dt);
      }
      if (needW) {
        at::Tensor xT = saved[0];
        if (column && sp) xT = gatherRows(saved[0], c).t().contiguous();
        gw = weightGradFp8(intoGrad, gT, qg.scaleInv, xT, saved[1], wdtype);
      }
    } else {
      // Rowwise: gy per token row (a column layer's rows are split over tp by feature); gx takes
      // W per input feature (a column layer's W rows are split over tp).
      auto qg = fp8Quantize(gy, Format::E5M2, Axis::Rows, opts(true, false, column ? c : nullptr));
      at::Tensor g = qg.codes, gInv = qg.scaleInv;
      if (!column && sp) g = gatherRows(qg.codes, c), gInv = gatherRows(qg.scaleInv, c);
      if (needX) {
        const auto wc = weightCodes(weight, detail::WeightUse::ColsBackward, [&] {
          return fp8Quantize(weight, Format::E4M3, Axis::Cols, opts(false, true, column ? c : nullptr));
        });
        gx = fp8Gemm(g, gInv, Format::E5M2, wc.codesT, wc.scaleInv, Format::E4M3, dt);
      }
      if (needW) {
        const at::Tensor xh = column && sp ? gatherRows(saved[0], c) : saved[0];
        const at::Tensor gh = !column && sp ? gatherRows(gy, c) : gy;
        gw = weightGradHigh(intoGrad, gh, xh, wdtype);
      }
    }
    if (gx.defined() && column) gx = sp ? reduceScatterRows(gx, c) : (allReduceIfShared(gx, c), gx);
    if (needB) {
      // A row layer's bias is replicated: its gradient sums every token (sp: over tp too).
      auto sum = at::sum(gy, {0}, /*keepdim=*/false, at::kFloat);
      if (!column && sp) allReduceIfShared(sum, c);
      if (into) {
        nn::accumulateBiasGrad(st->bias, sum.unsqueeze(0));
      } else {
        gb = sum.to(st->bias.scalar_type());
      }
    }
    if (gx.defined()) gx = gx.view(xshape);
    return {gx, gw, gb, at::Tensor()};
  }
};

}  // namespace

at::Tensor fp8ParallelLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const Fp8LinearSpec& spec) {
  TESSERA_CHECK(spec.tp, "fp8 linear: no tensor-parallel communicator given");
  TESSERA_CHECK(spec.recipe != fp8::Recipe::Off, "fp8 linear: called with the recipe off");
  TESSERA_CHECK(x.defined() && x.dim() >= 2 && weight.defined() && weight.dim() == 2 && x.size(-1) == weight.size(1),
                "fp8 linear (rank {} of tp {}): needs x [tokens, ..., in] and W [out, in]; got x {}, W {}",
                spec.tp->rank(), spec.tp->size(), x.defined() ? c10::str(x.sizes()) : "undefined",
                weight.defined() ? c10::str(weight.sizes()) : "undefined");
  TESSERA_CHECK(weight.device() == x.device(), "fp8 linear (rank {}): x is on {}, W on {}", spec.tp->rank(),
                x.device().str(), weight.device().str());
  auto st = c10::make_intrusive<Fp8State>(spec);
  return Fp8Linear::apply(x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, st);
}

}  // namespace tessera::tp
