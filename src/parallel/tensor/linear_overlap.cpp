// The column-parallel linear with an overlapped backward (contract in linear_overlap.h).
#include "tessera/parallel/tensor/linear_overlap.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/sm_carveout.h"
#include "tessera/fp8/fake_quant.h"
#include "kernels/gemm_accumulate.h"
#include "tessera/nn/accum_linear.h"
#include "parallel/tensor/fp8_linear.h"
#include "parallel/tensor/seq_chunks.h"

namespace tessera::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved tensors; rides in the autograd context.
struct OverlapState : torch::CustomClassHolder {
  OverlapState(CommPtr c, bool s, LinearOverlap o, LinearBackwardTrace t)
      : comm(std::move(c)), sp(s), overlap(o), trace(std::move(t)) {}
  CommPtr comm;
  bool sp;
  LinearOverlap overlap;
  LinearBackwardTrace trace;
  at::Tensor weight, bias;  // set when the gradients are summed into their .grad (accumulateGrad)
  fp8::Recipe fp8 = fp8::Recipe::Off;
  void note(const char* e) const {
    if (trace) trace(e);
  }
};

// x [n, ...] on every rank → [size·n, ...], rank r's block at rows [r·n, (r+1)·n). Async.
std::pair<at::Tensor, WorkPtr> launchGatherSeq(const at::Tensor& x, const CommPtr& c) {
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[0] *= c->size();
  auto out = at::empty(sizes, in.options());
  auto work = c->allGather(out, in);
  return {out, work};
}

struct ColumnLinearAsyncGrad : torch::autograd::Function<ColumnLinearAsyncGrad> {
  // bias is optional: an undefined tensor may not be an input of a custom Function in 1.13.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, c10::intrusive_ptr<OverlapState> st) {
    // The weight in the input's dtype (the autocast dtype under autocast), cast once here and
    // saved for backward instead of cast again there. Not through autocast's cache: a cast made
    // here, where grad mode is off, would be cached without autograd history for later users.
    const auto dt = x.scalar_type();
    at::Tensor wc = weight.to(dt), xSaved = x;
    // FP8 (fp8/fake_quant.h): the forward GEMM's operands quantized as whole tensors would be:
    // W's rows are this rank's, x's rows complete (its tokens, all features). Tensorwise saves
    // them for backward's GEMMs; rowwise saves the originals (gx takes W per column, gW neither).
    at::Tensor xq = x, wq = wc;
    if (st->fp8 != fp8::Recipe::Off) {
      const bool tensorwise = st->fp8 == fp8::Recipe::Tensorwise;
      const auto axis = tensorwise ? fp8::Axis::Tensor : fp8::Axis::Rows;
      wq = fp8::fakeQuantize(wc, fp8::Format::E4M3, axis, tensorwise ? st->comm : nullptr);
      xq = fp8::fakeQuantize(x, fp8::Format::E4M3, axis, tensorwise && st->sp ? st->comm : nullptr);
      if (tensorwise) xSaved = xq, wc = wq;
    }
    ctx->save_for_backward({xSaved, wc});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["wdtype"] = weight.scalar_type();
    if (!st->sp) return at::linear(xq, wq, bias);
    // This rank's rows first, while the others are gathered (in pieces: each piece's GEMMs while
    // the next piece is gathered).
    const int64_t in = weight.size(1), outLocal = weight.size(0);
    auto local = xq.reshape({-1, in}).contiguous();
    auto wt = wq.t();
    auto b = bias ? bias->to(dt) : at::Tensor();
    auto y = at::empty({local.size(0) * st->comm->size(), outLocal}, local.options());
    forEachGatheredBlock(local, st->comm, st->overlap.forwardChunks, st->overlap.smCarveout,
                         [&](const at::Tensor& block, int64_t row0) {
                           auto o = y.narrow(0, row0, block.size(0));
                           if (b.defined()) {
                             at::addmm_out(o, b, block, wt);
                           } else {
                             at::mm_out(o, block, wt);
                           }
                         });
    auto shape = x.sizes().vec();
    shape[0] *= st->comm->size();
    shape.back() = outLocal;
    return y.view(shape);
  }

  // gW (and gb): summed into .grad by the GEMM where the layer says so (nn/accum_linear.h), else
  // returned. With a gather in flight (sequence parallel), gW = Σ over row blocks gy[rows]ᵀ x[rows]:
  // this rank's block from the local input first, the others once gathered, summed in float32.
  static std::pair<at::Tensor, at::Tensor> weightGrads(OverlapState& st, const at::Tensor& gy, const at::Tensor& gyW,
                                                       const at::Tensor& x, const at::Tensor& total,
                                                       const WorkPtr& gather, c10::ScalarType wdtype, bool needW,
                                                       bool needB) {
    const auto& comm = st.comm;
    const auto dt = gy.scalar_type();
    const int64_t in = x.size(-1), outLocal = gyW.size(-1);
    const auto gy2 = gy.reshape({-1, outLocal});
    at::Tensor gw, gb;
    const bool into = st.weight.defined();
    if (needW && gather) {
      const int64_t mLocal = x.numel() / in, me = comm->rank();
      auto rows = [&](const at::Tensor& t, int64_t r0) { return t.narrow(0, r0, mLocal); };
      auto xs = total.reshape({-1, in});
      auto weightGrad = [&](const at::Tensor& g, const at::Tensor& xi) {
        if (into) {
          nn::accumulateWeightGrad(st.weight, g, xi);
        } else {
          kernels::gemmAccumulateTNInto(gw, {outLocal, in}, gy.device(), g.contiguous(), xi.contiguous());
        }
      };
      weightGrad(rows(gyW, me * mLocal), x.reshape({-1, in}).to(dt));
      gather->wait();
      for (int64_t q = 0; q < comm->size(); ++q) {
        if (q != me) weightGrad(rows(gyW, q * mLocal), rows(xs, q * mLocal).to(dt));
      }
      if (gw.defined()) gw = gw.to(wdtype);
    } else if (needW) {
      if (into) nn::accumulateWeightGrad(st.weight, gyW, total.reshape({-1, in}).to(dt));
      if (!into) gw = kernels::weightGradTN(gyW, total.reshape({-1, in}).to(dt), wdtype);
    }
    if (needB && into) nn::accumulateBiasGrad(st.bias, gy2);
    if (needB && !into) gb = gy2.sum(0);
    return {gw, gb};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor x = saved[0], w = saved[1];  // w: the weight in x's dtype
    const auto wdtype = ctx->saved_data["wdtype"].toScalarType();
    auto st = c10::static_intrusive_pointer_cast<OverlapState>(ctx->saved_data["state"].toCapsule());
    const bool hasBias = ctx->saved_data["bias"].toBool();
    const bool needX = ctx->needs_input_grad(0), needW = ctx->needs_input_grad(1);
    const bool needB = hasBias && ctx->needs_input_grad(2);  // no edge 2 without a bias
    const auto& comm = st->comm;
    const at::Tensor gy = grads[0];
    const auto dt = gy.scalar_type();
    const int64_t outLocal = w.size(0), in = w.size(1);
    auto gy2 = gy.reshape({-1, outLocal});
    // FP8: gy (E5M2) scaled over its whole rows or tensor, which this rank holds a column slice
    // of: amaxes all-reduced over tp. gx takes it with W (tensorwise: the saved codes; rowwise:
    // W per input feature, its columns split over tp too); gW takes it only in tensorwise.
    at::Tensor gyX = gy2, gyW = gy2, wX = w;
    if (st->fp8 != fp8::Recipe::Off) {
      const bool tensorwise = st->fp8 == fp8::Recipe::Tensorwise;
      gyX = fp8::fakeQuantize(gy2, fp8::Format::E5M2, tensorwise ? fp8::Axis::Tensor : fp8::Axis::Rows, comm);
      if (tensorwise) gyW = gyX;
      if (!tensorwise) wX = fp8::fakeQuantize(w, fp8::Format::E4M3, fp8::Axis::Cols, comm);
    }

    // Sequence parallel: re-gather the input for gW; it runs during the gx GEMM (and the GEMMs
    // of gW's own rows, which need only the local input).
    at::Tensor total = x;
    WorkPtr gather;
    if (st->sp && needW) std::tie(total, gather) = launchGatherSeq(x, comm);
    // The GEMMs beside a collective leave it its SMs (seq_chunks.h says why): from here while
    // the gather runs, else from the input gradient's collective on.
    std::optional<SmCarveoutGuard> carve;
    if (gather) carve.emplace(st->overlap.smCarveout);

    at::Tensor gx;
    WorkPtr reduce;
    if (needX) {
      auto shape = gy.sizes().vec();
      shape.back() = in;
      auto full = gyX.mm(wX.to(dt)).view(shape);  // fresh and contiguous: communicated in place
      st->note("grad_input");
      if (!st->sp) {
        gx = full;
        reduce = comm->allReduce(gx);
      } else {
        // The reduce-scatter queues behind the gather on the communicator; the gather's
        // result is needed for gW below anyway.
        auto sizes = full.sizes().vec();
        sizes[0] /= comm->size();
        gx = at::empty(sizes, full.options());
        reduce = comm->reduceScatter(gx, full);
      }
    }
    if (reduce && !carve) carve.emplace(st->overlap.smCarveout);

    auto [gw, gb] = weightGrads(*st, gy, gyW, x, total, gather, wdtype, needW, needB);
    if (needW || needB) st->note("grad_weight");
    carve.reset();

    if (reduce) reduce->wait();
    if (gx.defined()) gx = gx.to(x.scalar_type());
    if (gb.defined()) gb = gb.to(wdtype);
    return {gx, gw, gb, at::Tensor()};
  }
};

}  // namespace

at::Tensor columnLinearAsyncGrad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                 const CommPtr& tp, bool sequenceParallel, LinearOverlap overlap,
                                 LinearBackwardTrace trace, bool accumulateGrad, fp8::Recipe fp8) {
  TESSERA_CHECK(tp, "tp::column_linear_async_grad: no tensor-parallel communicator given");
  TESSERA_CHECK(x.dim() >= 1, "tp::column_linear_async_grad: input must have at least one dimension");
  // A group of one: no communication (with FP8 the op itself, its collectives on one rank).
  if (tp->size() == 1 && fp8 == fp8::Recipe::Off) return at::linear(x, weight, bias);
  if (fp8 != fp8::Recipe::Off && x.is_cuda())  // real FP8 GEMMs (fp8_linear.h); the CPU emulates them below
    return fp8ParallelLinear(castForCudaAutocast(x), weight, bias,
                             {Fp8Parallel::Column, tp, sequenceParallel, accumulateGrad, fp8});
  // Under CUDA autocast the input is saved and (sequence parallel) all-gathered in bf16/fp16,
  // as at::linear would cast it anyway: half the bytes of an fp32 LayerNorm output.
  auto st = c10::make_intrusive<OverlapState>(tp, sequenceParallel, overlap, std::move(trace));
  if (accumulateGrad) st->weight = weight, st->bias = bias;
  st->fp8 = fp8;
  return ColumnLinearAsyncGrad::apply(castForCudaAutocast(x), weight,
                                      bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, st);
}

}  // namespace tessera::tp
