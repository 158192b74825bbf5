// The row-parallel linear with its reduction (contract in row_linear.h).
#include "parallel/tensor/row_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <optional>

#include "tessera/common/error.h"
#include "kernels/gemm_accumulate.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/common/sm_carveout.h"
#include "tessera/fp8/fake_quant.h"
#include "parallel/tensor/fp8_linear.h"
#include "parallel/tensor/seq_chunks.h"

namespace tessera::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RowState : torch::CustomClassHolder {
  RowState(CommPtr c, bool s, LinearOverlap o) : comm(std::move(c)), sp(s), overlap(o) {}
  CommPtr comm;
  bool sp;
  LinearOverlap overlap;
  at::Tensor weight, bias;  // set when the gradients are summed into their .grad (accumulateGrad)
  fp8::Recipe fp8 = fp8::Recipe::Off;
};

// Rows of out = x wtᵀ (+ b) in pieces, each piece all-reduced in place as soon as its GEMM is queued.
void allReduceRows(const at::Tensor& x2, const at::Tensor& wt, const at::Tensor& b, const at::Tensor& out,
                   const RowState& st) {
  std::vector<WorkPtr> works;
  std::optional<SmCarveoutGuard> carve;
  const auto pieces = pieceSizes(x2.size(0), st.overlap.forwardChunks);
  int64_t r0 = 0;
  for (int64_t rows : pieces) {
    auto o = out.narrow(0, r0, rows);
    auto xi = x2.narrow(0, r0, rows);
    if (b.defined()) {
      at::addmm_out(o, b, xi, wt);
    } else {
      at::mm_out(o, xi, wt);
    }
    works.push_back(st.comm->allReduce(o));
    if (!carve && pieces.size() > 1) carve.emplace(st.overlap.smCarveout);  // later pieces run beside it
    r0 += rows;
  }
  carve.reset();
  for (auto& w : works) w->wait();
}

// Column pieces of x wtᵀ (+ b), each reduce-scattered along dim 0 at once; this rank's rows.
at::Tensor reduceScatterColumns(const at::Tensor& x2, const at::Tensor& wt, const at::Tensor& b,
                                const RowState& st) {
  const int64_t mLocal = x2.size(0) / st.comm->size();
  std::vector<at::Tensor> parts;
  std::vector<WorkPtr> works;
  std::optional<SmCarveoutGuard> carve;
  const auto pieces = pieceSizes(wt.size(1), st.overlap.forwardChunks);
  int64_t c0 = 0;
  for (int64_t cols : pieces) {
    auto wi = wt.narrow(1, c0, cols);
    auto full = b.defined() ? at::addmm(b.narrow(0, c0, cols), x2, wi) : at::mm(x2, wi);
    parts.push_back(at::empty({mLocal, cols}, full.options()));
    works.push_back(st.comm->reduceScatter(parts.back(), full));
    if (!carve && pieces.size() > 1) carve.emplace(st.overlap.smCarveout);
    c0 += cols;
  }
  carve.reset();
  for (auto& w : works) w->wait();
  return parts.size() == 1 ? parts[0] : at::cat(parts, 1);
}

// This rank's token shard of Σ_q x_q wtᵀ (+ b) by the ring of row_linear.h (x2's rows divisible
// by the group's size).
at::Tensor ringReduceScatterRows(const at::Tensor& x2, const at::Tensor& wt, const at::Tensor& b, const RowState& st) {
  const auto& comm = st.comm;
  const int64_t p = comm->size(), me = comm->rank(), mLocal = x2.size(0) / p;
  const int next = static_cast<int>((me + 1) % p), prev = static_cast<int>((me + p - 1) % p);
  at::Tensor incoming;
  WorkPtr inFlight;
  std::optional<SmCarveoutGuard> carve;
  for (int64_t s = 0;; ++s) {
    const int64_t shard = ((me - s - 1) % p + p) % p;
    auto part = at::mm(x2.narrow(0, shard * mLocal, mLocal), wt);  // beside the transfer of step s − 1
    if (inFlight) {
      inFlight->wait();
      part.add_(incoming);
    }
    if (s + 1 == p) {
      carve.reset();
      if (b.defined()) part.add_(b);
      return part;
    }
    incoming = at::empty_like(part);
    inFlight = comm->batchP2P({{P2POp::Send, part, next}, {P2POp::Recv, incoming, prev}});
    if (!carve) carve.emplace(st.overlap.smCarveout);
  }
}

struct RowLinearReduce : torch::autograd::Function<RowLinearReduce> {
  // bias is optional: an undefined tensor may not be an input of a custom Function in 1.13.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, c10::intrusive_ptr<RowState> st) {
    // The weight in x's dtype, cast once and saved for backward (as in linear_overlap.cpp).
    const auto dt = x.scalar_type();
    at::Tensor wc = weight.to(dt), xSaved = x;
    // FP8 (fp8/fake_quant.h): x's and W's rows are split over tp by input feature, so their
    // amaxes are all-reduced; tensorwise saves the quantized operands for backward's GEMMs.
    at::Tensor xq = x, wq = wc;
    if (st->fp8 != fp8::Recipe::Off) {
      const auto axis = st->fp8 == fp8::Recipe::Tensorwise ? fp8::Axis::Tensor : fp8::Axis::Rows;
      wq = fp8::fakeQuantize(wc, fp8::Format::E4M3, axis, st->comm);
      xq = fp8::fakeQuantize(x, fp8::Format::E4M3, axis, st->comm);
      if (st->fp8 == fp8::Recipe::Tensorwise) xSaved = xq, wc = wq;
    }
    ctx->save_for_backward({xSaved, wc});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["wdtype"] = weight.scalar_type();
    const int64_t out = weight.size(0);
    auto x2 = xq.reshape({-1, weight.size(1)}).contiguous();
    auto wt = wq.t();
    auto shape = x.sizes().vec();
    shape.back() = out;
    const int64_t p = st->comm->size();
    if (st->overlap.ring && x2.size(0) % p == 0) {
      auto mine = ringReduceScatterRows(x2, wt, bias ? bias->to(dt) : at::Tensor(), *st);
      if (st->sp) {
        shape[0] /= p;
        return mine.view(shape);
      }
      auto y = at::empty({x2.size(0), out}, x2.options());
      st->comm->allGather(y, mine)->wait();
      return y.view(shape);
    }
    // The bias once: rank 0 adds it before the sum (every rank's shard then has it once).
    auto b = bias && st->comm->rank() == 0 ? bias->to(dt) : at::Tensor();
    if (!st->sp) {
      auto y = at::empty({x2.size(0), out}, x2.options());
      allReduceRows(x2, wt, b, y, *st);
      return y.view(shape);
    }
    shape[0] /= p;
    return reduceScatterColumns(x2, wt, b, *st).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor x = saved[0], w = saved[1];  // w: the weight in x's dtype
    const auto wdtype = ctx->saved_data["wdtype"].toScalarType();
    auto st = c10::static_intrusive_pointer_cast<RowState>(ctx->saved_data["state"].toCapsule());
    const bool needX = ctx->needs_input_grad(0), needW = ctx->needs_input_grad(1);
    const bool needB = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    const auto dt = x.scalar_type();
    const int64_t out = w.size(0), in = w.size(1);
    auto gy = grads[0].reshape({-1, out}).to(dt).contiguous();
    auto x2 = x.reshape({-1, in});
    auto wd = w.to(dt);
    // FP8: gy (E5M2) per tensor (its token shards gathered below: amax over tp with sequence
    // parallel) or per token row (all output features here); rowwise's gx takes W per input
    // feature, its gW stays in the input precision. The bias gradient always takes gy as it is.
    at::Tensor gyX = gy;
    const bool quant = st->fp8 != fp8::Recipe::Off, tensorwise = st->fp8 == fp8::Recipe::Tensorwise;
    if (quant) {
      gyX = fp8::fakeQuantize(gy, fp8::Format::E5M2, tensorwise ? fp8::Axis::Tensor : fp8::Axis::Rows,
                              tensorwise && st->sp ? st->comm : nullptr);
      if (!tensorwise) wd = fp8::fakeQuantize(wd, fp8::Format::E4M3, fp8::Axis::Cols);
    }
    const at::Tensor gyW = tensorwise ? gyX : gy;
    at::Tensor gx, gw, gb;
    const bool into = st->weight.defined();  // summed into .grad by the GEMM (nn/accum_linear.h)
    if (!st->sp) {
      if (needX) gx = gyX.mm(wd).view(x.sizes());
      if (needW && into) nn::accumulateWeightGrad(st->weight, gyW, x2);
      if (needW && !into) gw = kernels::weightGradTN(gyW, x2, wdtype);
      if (needB && into) nn::accumulateBiasGrad(st->bias, gy);
      if (needB && !into) gb = gy.sum(0).to(wdtype);
      return {gx, gw, gb, at::Tensor()};
    }
    // Sequence parallel: gy's token shards gathered in pieces, each piece's GEMMs meanwhile.
    if (needX) gx = at::empty({x2.size(0), in}, x2.options());
    // The bias is replicated: its gradient is summed over the blocks in row order, the same
    // order on every rank (the blocks arrive in a rank-dependent one), so ranks agree bitwise.
    std::map<int64_t, at::Tensor> biasParts;
    // With FP8 the quantized and the original gy travel in one gather, side by side.
    forEachGatheredBlock(quant ? at::cat({gyX, gy}, 1) : gy, st->comm, st->overlap.forwardChunks, st->overlap.smCarveout,
                         [&](const at::Tensor& both, int64_t row0) {
                           const at::Tensor block = quant ? both.narrow(1, out, out) : both;
                           const at::Tensor blockX = quant ? both.narrow(1, 0, out) : both;
                           const at::Tensor blockW = tensorwise ? blockX : block;
                           const int64_t rows = block.size(0);
                           if (needX) {
                             auto rowsOut = gx.narrow(0, row0, rows);
                             at::mm_out(rowsOut, blockX, wd);
                           }
                           if (needW && into) nn::accumulateWeightGrad(st->weight, blockW, x2.narrow(0, row0, rows));
                           if (needB) biasParts[row0] = block.sum(0, /*keepdim=*/false, at::kFloat);
                           if (needW && !into) {  // pieces summed in float32 by the GEMM
                             kernels::gemmAccumulateTNInto(gw, {out, in}, gy.device(), blockW.contiguous(),
                                                           x2.narrow(0, row0, rows).contiguous());
                           }
                         });
    if (needB) {
      auto sum = at::zeros({out}, gy.options().dtype(at::kFloat));
      for (const auto& [row0, part] : biasParts) sum.add_(part);
      if (into) {
        nn::accumulateBiasGrad(st->bias, sum.unsqueeze(0));  // a sum over one row: exact
      } else {
        gb = sum;
      }
    }
    if (gx.defined()) gx = gx.view(x.sizes());
    if (gw.defined()) gw = gw.to(wdtype);
    if (gb.defined()) gb = gb.to(wdtype);
    return {gx, gw, gb, at::Tensor()};
  }
};

}  // namespace

at::Tensor rowLinearReduce(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const CommPtr& tp,
                           bool sequenceParallel, LinearOverlap overlap, bool accumulateGrad, fp8::Recipe fp8) {
  TESSERA_CHECK(tp && tp->size() > 1, "tp::row_linear_reduce: needs a tensor-parallel group of two or more ranks");
  TESSERA_CHECK(!sequenceParallel || (x.dim() >= 2 && x.size(0) % tp->size() == 0),
                "tp::row_linear_reduce: with sequence parallel, dimension 0 of the input (size {}) must be divisible "
                "by the tensor-parallel size {} (rank {})",
                x.dim() ? x.size(0) : 0, tp->size(), tp->rank());
  if (fp8 != fp8::Recipe::Off && x.is_cuda())  // real FP8 GEMMs (fp8_linear.h); the CPU emulates them below
    return fp8ParallelLinear(x, weight, bias, {Fp8Parallel::Row, tp, sequenceParallel, accumulateGrad, fp8});
  auto st = c10::make_intrusive<RowState>(tp, sequenceParallel, overlap);
  if (accumulateGrad) st->weight = weight, st->bias = bias;
  st->fp8 = fp8;
  return RowLinearReduce::apply(x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, st);
}

}  // namespace tessera::tp
