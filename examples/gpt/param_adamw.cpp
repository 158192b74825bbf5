#include "param_adamw.h"

#include <ATen/ATen.h>

#include "common/error.h"
#include "kernels/adamw.h"

namespace tessera::gpt {

ParamAdamW::ParamAdamW(std::vector<at::Tensor> params, AdamWOptions o) : params_(std::move(params)), o_(o) {
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
}

void ParamAdamW::step() {
  at::NoGradGuard ng;
  ++step_;
  kernels::AdamWStep s{o_.lr, o_.beta1, o_.beta2, o_.eps, o_.weightDecay, step_};
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    TESSERA_CHECK(g.defined(), "ParamAdamW: parameter {} of {} ({}) has no gradient", i, params_.size(),
                  c10::str(params_[i].sizes()));
    kernels::adamwStep(params_[i], g.is_contiguous() ? g : g.contiguous(), m_[i], v_[i], s);
  }
}

}  // namespace tessera::gpt
