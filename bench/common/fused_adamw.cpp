// The benchmarks' AdamW; see fused_adamw.h.
#include "fused_adamw.h"

#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include <cmath>

#include "tessera/common/error.h"

namespace tessera::bench {

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, double lr, double beta1, double beta2, double eps,
                       double weightDecay)
    : params_(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), wd_(weightDecay) {}

void FusedAdamW::step() {
  std::vector<size_t> all(params_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  stepIndices(all);
}

void FusedAdamW::step(const std::vector<at::Tensor>& subset) {
  if (index_.empty())
    for (size_t i = 0; i < params_.size(); ++i) index_[params_[i].unsafeGetTensorImpl()] = i;
  std::vector<size_t> which;
  for (const auto& p : subset) {
    auto it = index_.find(p.unsafeGetTensorImpl());
    TESSERA_CHECK(it != index_.end(), "FusedAdamW: a parameter of shape {} is not one of this optimizer's",
                  c10::str(p.sizes()));
    which.push_back(it->second);
  }
  stepIndices(which);
}

void FusedAdamW::stepIndices(const std::vector<size_t>& which) {
  at::NoGradGuard ng;
  if (expAvg_.empty()) {
    for (auto& p : params_) {
      expAvg_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      expAvgSq_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
    }
  }
  std::vector<at::Tensor> ps, gs, ms, vs, ss;
  for (size_t i : which) {
    const auto& g = params_[i].grad();
    if (!g.defined()) continue;
    ps.push_back(params_[i]);
    gs.push_back(g);
    ms.push_back(expAvg_[i]);
    vs.push_back(expAvgSq_[i]);
    ss.push_back(steps_[i]);
  }
  if (ps.empty()) return;
  // As torch.optim.AdamW(fused=True): the caller increments the step counts, the kernel reads
  // them for the bias correction.
  at::_foreach_add_(ss, at::Scalar(1.0));
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_(ps, gs, ms, vs, /*max_exp_avg_sqs=*/{}, ss, lr_, beta1_, beta2_, wd_, eps_,
                    /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
#else
  for (size_t i = 0; i < ps.size(); ++i) {  // the same update, op by op (CPU smoke runs)
    const double t = ss[i].item<double>();
    ps[i].mul_(1 - lr_ * wd_);
    ms[i].mul_(beta1_).add_(gs[i], 1 - beta1_);
    vs[i].mul_(beta2_).addcmul_(gs[i], gs[i], 1 - beta2_);
    auto denom = (vs[i] / (1 - std::pow(beta2_, t))).sqrt_().add_(eps_);
    ps[i].addcdiv_(ms[i], denom, -lr_ / (1 - std::pow(beta1_, t)));
  }
#endif
}

void FusedAdamW::zeroGrad(bool setToNone) {
  for (auto& p : params_) {
    auto& g = p.mutable_grad();
    if (!g.defined()) continue;
    if (setToNone) g.reset();
    else g.zero_();
  }
}

}  // namespace tessera::bench
