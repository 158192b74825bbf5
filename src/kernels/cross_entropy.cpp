// The cross-entropy pieces: checks, the chunked ATen references and the CUDA dispatch
// (cross_entropy.h).
#include "kernels/cross_entropy.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/cross_entropy_cuda.h"
#endif

namespace tessera::kernels {
namespace {

using detail::require;

// Rows per chunk of the references: at most 2^22 float32 elements (16 MiB) per temporary.
int64_t chunkRows(int64_t width) { return std::max<int64_t>(1, (int64_t{1} << 22) / width); }

void checkLogits(const char* op, const at::Tensor& logits, const at::Tensor& targets) {
  detail::elemType(op, "logits", logits);
  require(logits.dim() == 2 && logits.size(0) > 0 && logits.size(1) > 0 && rowsContiguous(logits), op, "logits",
          "an [N, W] tensor with N, W > 0 and contiguous rows", logits);
  require(targets.defined() && targets.scalar_type() == at::kLong && targets.dim() == 1 &&
              targets.size(0) == logits.size(0) && targets.is_contiguous() && targets.device() == logits.device(),
          op, "targets", "a contiguous int64 [N] tensor on the logits' device", targets);
}

void checkRowStats(const char* op, const at::Tensor& logits, const at::Tensor& rowMax, const at::Tensor& sumExp,
                   const at::Tensor& gOverN) {
  for (const auto& [what, t] :
       {std::pair<const char*, const at::Tensor&>{"rowMax", rowMax}, {"sumExp", sumExp}}) {
    require(t.defined() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == logits.size(0) &&
                t.is_contiguous() && t.device() == logits.device(),
            op, what, "a contiguous float32 [N] tensor on the logits' device", t);
  }
  require(gOverN.defined() && gOverN.scalar_type() == at::kFloat && gOverN.numel() == 1 &&
              gOverN.device() == logits.device(),
          op, "gOverN", "a float32 scalar tensor on the logits' device", gOverN);
}

#ifdef TESSERA_HAVE_NCCL
// The arguments both kernels take (checked by the caller).
detail::CrossEntropyArgs kernelArgs(const char* op, const at::Tensor& logits, const at::Tensor& targets,
                                    int64_t start) {
  detail::CrossEntropyArgs a{};
  a.logits = logits.data_ptr();
  a.type = detail::elemType(op, "logits", logits);
  a.rows = logits.size(0);
  a.width = logits.size(1);
  a.ld = a.gradLd = logits.stride(0);
  a.targets = reinterpret_cast<const long long*>(targets.data_ptr<int64_t>());
  a.start = start;
  a.vec = (a.width * logits.element_size()) % 16 == 0 && (a.ld * logits.element_size()) % 16 == 0 &&
          detail::aligned(logits, 16);
  return a;
}
#endif

}  // namespace

bool rowsContiguous(const at::Tensor& t) {
  return t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1) && t.stride(0) >= t.size(1);
}

at::Tensor crossEntropyPartialsReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start) {
  checkLogits("crossEntropyPartialsReference", logits, targets);
  at::NoGradGuard noGrad;
  const int64_t n = logits.size(0), w = logits.size(1);
  auto out = at::empty({3, n}, logits.options().dtype(at::kFloat));
  const auto local = targets - start;
  const auto outside = (local < 0).logical_or(local >= w);
  for (int64_t r0 = 0; r0 < n; r0 += chunkRows(w)) {
    const int64_t rows = std::min(chunkRows(w), n - r0);
    auto x = logits.narrow(0, r0, rows).to(at::kFloat);  // read before its rows of grad are written
    auto m = std::get<0>(x.max(1));
    out[0].narrow(0, r0, rows).copy_(m);
    out[1].narrow(0, r0, rows).copy_((x - m.unsqueeze(1)).exp_().sum(1));
    auto idx = local.narrow(0, r0, rows).masked_fill(outside.narrow(0, r0, rows), 0).unsqueeze(1);
    out[2].narrow(0, r0, rows).copy_(x.gather(1, idx).squeeze(1).masked_fill(outside.narrow(0, r0, rows), 0.0));
  }
  return out;
}

// out: where the gradient goes (the logits themselves for the in-place form), else a new tensor.
at::Tensor crossEntropyGradReference(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                     const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN,
                                     const at::Tensor& out) {
  checkLogits("crossEntropyGradReference", logits, targets);
  checkRowStats("crossEntropyGradReference", logits, rowMax, sumExp, gOverN);
  at::NoGradGuard noGrad;
  const int64_t n = logits.size(0), w = logits.size(1);
  auto grad = out.defined() ? out : at::empty_like(logits);
  const auto g = gOverN.reshape({});
  const auto local = targets - start;
  const auto inside = (local >= 0).logical_and(local < w);
  for (int64_t r0 = 0; r0 < n; r0 += chunkRows(w)) {
    const int64_t rows = std::min(chunkRows(w), n - r0);
    auto x = logits.narrow(0, r0, rows).to(at::kFloat);
    auto scale = (g / sumExp.narrow(0, r0, rows)).unsqueeze(1);
    auto chunk = (x - rowMax.narrow(0, r0, rows).unsqueeze(1)).exp_() * scale;
    auto here = inside.narrow(0, r0, rows);
    auto idx = local.narrow(0, r0, rows).masked_fill(here.logical_not(), 0).unsqueeze(1);
    chunk.scatter_add_(1, idx, here.to(at::kFloat).unsqueeze(1) * -g);
    grad.narrow(0, r0, rows).copy_(chunk);
  }
  return grad;
}

at::Tensor crossEntropyPartials(const at::Tensor& logits, const at::Tensor& targets, int64_t start) {
  const char* op = "crossEntropyPartials";
  if (!detail::onCuda(op, logits)) return crossEntropyPartialsReference(logits, targets, start);
#ifdef TESSERA_HAVE_NCCL
  checkLogits(op, logits, targets);
  auto out = at::empty({3, logits.size(0)}, logits.options().dtype(at::kFloat));
  auto a = kernelArgs(op, logits, targets, start);
  a.partials = out.data_ptr<float>();
  detail::checkLaunched(detail::launchCrossEntropyPartials(a, detail::launchFor(logits)), op,
                        "crossEntropyPartialsKernel", logits);
  return out;
#else
  return {};
#endif
}

namespace {
// The gradient into `grad` (a new tensor, or the logits themselves).
at::Tensor gradInto(const char* op, const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                    const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN, at::Tensor grad) {
  if (!detail::onCuda(op, logits)) return crossEntropyGradReference(logits, targets, start, rowMax, sumExp, gOverN, grad);
#ifdef TESSERA_HAVE_NCCL
  checkLogits(op, logits, targets);
  checkRowStats(op, logits, rowMax, sumExp, gOverN);
  const auto g = gOverN.contiguous();
  if (!grad.defined()) grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
  auto a = kernelArgs(op, logits, targets, start);
  a.rowMax = rowMax.data_ptr<float>();
  a.sumExp = sumExp.data_ptr<float>();
  a.gOverN = g.data_ptr<float>();
  a.grad = grad.data_ptr();
  a.gradLd = grad.stride(0);
  a.vec = a.vec && (a.gradLd * grad.element_size()) % 16 == 0 && detail::aligned(grad, 16);
  detail::checkLaunched(detail::launchCrossEntropyGrad(a, detail::launchFor(logits)), op, "crossEntropyGradKernel",
                        logits);
  return grad;
#else
  return {};
#endif
}
}  // namespace

at::Tensor crossEntropyGrad(const at::Tensor& logits, const at::Tensor& targets, int64_t start,
                            const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN) {
  return gradInto("crossEntropyGrad", logits, targets, start, rowMax, sumExp, gOverN, at::Tensor());
}

at::Tensor crossEntropyGradInPlace(at::Tensor& logits, const at::Tensor& targets, int64_t start,
                                   const at::Tensor& rowMax, const at::Tensor& sumExp, const at::Tensor& gOverN) {
  TESSERA_CHECK(logits.defined() && rowsContiguous(logits), "crossEntropyGradInPlace: logits must have contiguous rows");
  return gradInto("crossEntropyGradInPlace", logits, targets, start, rowMax, sumExp, gOverN, logits);
}

}  // namespace tessera::kernels
