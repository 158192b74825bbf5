// Multi-tensor AdamW: checks, the per-tensor CPU reference, and the CUDA launch list
// (multi_tensor_adamw.h).
#include "kernels/multi_tensor_adamw.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/multi_tensor_adamw_cuda.h"
#endif

namespace tessera::kernels {
namespace {

constexpr const char* kOp = "multiTensorAdamW";

void checkAll(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& expAvgs, const std::vector<at::Tensor>& expAvgSqs,
              const std::vector<bool>& decay, const AdamWStep& s, const std::vector<at::Tensor>& copies) {
  const size_t n = params.size();
  TESSERA_CHECK(grads.size() == n && expAvgs.size() == n && expAvgSqs.size() == n && decay.size() == n &&
                    (copies.empty() || copies.size() == n),
                "{}: {} params, {} grads, {} expAvgs, {} expAvgSqs, {} decay flags, {} bf16 copies (all equal; copies "
                "may be none)",
                kOp, n, grads.size(), expAvgs.size(), expAvgSqs.size(), decay.size(), copies.size());
  TESSERA_CHECK(s.step >= 1, "{}: step {} must be >= 1", kOp, s.step);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    TESSERA_CHECK(p.defined() && p.scalar_type() == at::kFloat && p.is_contiguous() &&
                      (i == 0 || p.device() == params[0].device()),
                  "{}: params[{}] must be a contiguous float32 tensor on {} (got {})", kOp, i,
                  params[0].defined() ? params[0].device().str() : "-", detail::describe(p));
    const std::pair<const char*, const at::Tensor*> ts[] = {{"grads", &grads[i]}, {"expAvgs", &expAvgs[i]},
                                                             {"expAvgSqs", &expAvgSqs[i]}};
    for (const auto& [list, t] : ts) {
      TESSERA_CHECK(t->defined() && t->scalar_type() == at::kFloat && t->is_contiguous() && t->numel() == p.numel() &&
                        t->device() == p.device(),
                    "{}: {}[{}] must be a contiguous float32 tensor of {} elements on {} like params[{}] (got {})",
                    kOp, list, i, p.numel(), p.device().str(), i, detail::describe(*t));
    }
    if (!copies.empty()) {
      const at::Tensor& c = copies[i];
      TESSERA_CHECK(c.defined() && c.scalar_type() == at::kBFloat16 && c.is_contiguous() &&
                        c.numel() == p.numel() && c.device() == p.device(),
                    "{}: bf16Copies[{}] must be a contiguous bfloat16 tensor of {} elements on {} (got {})", kOp, i,
                    p.numel(), p.device().str(), detail::describe(c));
    }
  }
}

AdamWStep withDecay(const AdamWStep& s, bool decay) {
  AdamWStep out = s;
  if (!decay) out.weightDecay = 0;
  return out;
}

}  // namespace

void checkGradScale(const char* op, const at::Tensor& gradScale, const at::Tensor& like) {
  TESSERA_CHECK(!gradScale.defined() || (gradScale.scalar_type() == at::kFloat && gradScale.numel() == 1 &&
                                         (!like.defined() || gradScale.device() == like.device())),
                "{}: gradScale must be one float32 value on {} (got {})", op,
                like.defined() ? like.device().str() : "the params' device", detail::describe(gradScale));
}

void multiTensorAdamW(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& expAvgs, const std::vector<at::Tensor>& expAvgSqs,
                      const std::vector<bool>& decay, const AdamWStep& s, const std::vector<at::Tensor>& copies,
                      const at::Tensor& gradScale) {
  checkAll(params, grads, expAvgs, expAvgSqs, decay, s, copies);
  checkGradScale(kOp, gradScale, params.empty() ? at::Tensor() : params[0]);
  if (params.empty()) return;
  if (!detail::onCuda(kOp, params[0])) {
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = gradScale.defined() ? grads[i].mul(gradScale.reshape({})) : grads[i];
      adamwStepReference(params[i], g, expAvgs[i], expAvgSqs[i], withDecay(s, decay[i]));
      if (!copies.empty()) copies[i].copy_(params[i]);
    }
    return;
  }
#ifdef TESSERA_HAVE_NCCL
  const auto k = detail::adamwScalars(s.lr, s.beta1, s.beta2, s.eps, s.weightDecay, s.step);
  std::vector<detail::AdamWTensor> ts;
  ts.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ts.push_back({params[i].data_ptr<float>(), grads[i].data_ptr<float>(), expAvgs[i].data_ptr<float>(),
                  expAvgSqs[i].data_ptr<float>(), copies.empty() ? nullptr : copies[i].data_ptr(), params[i].numel(),
                  decay[i] ? k.decay : 1.0f});
  }
  const auto err =
      detail::launchMultiTensorAdamW(ts.data(), static_cast<int>(ts.size()), k, detail::launchFor(params[0]),
                                     gradScale.defined() ? gradScale.data_ptr<float>() : nullptr);
  TESSERA_CHECK(err.empty(), "{}: CUDA kernel multiTensorAdamWKernel failed on {} ({} tensors): {}", kOp,
                params[0].device().str(), params.size(), err);
#endif
}

}  // namespace tessera::kernels
