#include "kernels/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"

#ifdef TESSERA_HAVE_NCCL
#include "comm/nccl/cuda_stream.h"
#include "kernels/adamw_cuda.h"
#endif

namespace tessera::kernels {
namespace {

void check(const char* fn, const at::Tensor& param, const at::Tensor& grad, const at::Tensor& m, const at::Tensor& v,
           const AdamWStep& s) {
  TESSERA_CHECK(s.step >= 1, "{}: step {} must be >= 1", fn, s.step);
  const std::pair<const char*, const at::Tensor*> ts[] = {{"param", &param}, {"grad", &grad}, {"expAvg", &m},
                                                           {"expAvgSq", &v}};
  for (const auto& [name, t] : ts) {
    TESSERA_CHECK(t->defined() && t->scalar_type() == at::kFloat && t->is_contiguous() &&
                      t->numel() == param.numel() && t->device() == param.device(),
                  "{}: {} must be a contiguous float32 tensor of {} elements on {} (got {} of {} elements on {})", fn,
                  name, param.numel(), param.device().str(), t->defined() ? dtypeName(t->scalar_type()) : "undefined",
                  t->defined() ? t->numel() : 0, t->defined() ? t->device().str() : "-");
  }
}

}  // namespace

#ifdef TESSERA_HAVE_NCCL
detail::AdamWScalars detail::adamwScalars(double lr, double beta1, double beta2, double eps, double weightDecay,
                                          long long step) {
  AdamWScalars k;
  k.decay = static_cast<float>(1 - lr * weightDecay);
  k.beta1 = static_cast<float>(beta1);
  k.oneMinusBeta1 = static_cast<float>(1 - beta1);
  k.beta2 = static_cast<float>(beta2);
  k.oneMinusBeta2 = static_cast<float>(1 - beta2);
  k.sqrtBc2 = static_cast<float>(std::sqrt(1 - std::pow(beta2, static_cast<double>(step))));
  k.eps = static_cast<float>(eps);
  k.stepSize = static_cast<float>(lr / (1 - std::pow(beta1, static_cast<double>(step))));
  return k;
}
#endif

void adamwStepReference(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                        const AdamWStep& s) {
  check("adamwStepReference", p, g, m, v, s);
  if (s.weightDecay != 0) p.mul_(1 - s.lr * s.weightDecay);
  const double bc1 = 1 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1 - std::pow(s.beta2, static_cast<double>(s.step));
  m.mul_(s.beta1).add_(g, 1 - s.beta1);
  v.mul_(s.beta2).addcmul_(g, g, 1 - s.beta2);
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(s.eps);
  p.addcdiv_(m, denom, -s.lr / bc1);
}

void adamwStep(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v, const AdamWStep& s) {
  if (!p.is_cuda()) {
    adamwStepReference(p, g, m, v, s);
    return;
  }
#ifdef TESSERA_HAVE_NCCL
  check("adamwStep", p, g, m, v, s);
  const auto k = detail::adamwScalars(s.lr, s.beta1, s.beta2, s.eps, s.weightDecay, s.step);
  const int device = p.device().index();
  const auto err = detail::launchAdamW(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                       v.data_ptr<float>(), p.numel(), k, cuda::currentStream(device), device);
  TESSERA_CHECK(err.empty(), "adamwStep: CUDA kernel adamwKernel failed on cuda:{} ({} elements): {}", device,
                p.numel(), err);
#else
  TESSERA_CHECK(false, "adamwStep: tensors are on {} but tessera was built without CUDA", p.device().str());
#endif
}

}  // namespace tessera::kernels
