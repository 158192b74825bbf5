#include "tessera/optim/adamw.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/adamw.h"
#include "kernels/multi_tensor_adamw.h"
#include "optim/adamw_step.h"

namespace tessera::optim {

bool decaysByName(const std::string& name, bool embeddings) {
  const auto dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
  const auto ownerDot = owner.rfind('.');
  const std::string module = ownerDot == std::string::npos ? owner : owner.substr(ownerDot + 1);
  if (last == "bias") return false;
  if (module.find("norm") != std::string::npos || module.rfind("ln", 0) == 0) return false;
  if (module == "emb" || module == "pos" || module.find("embed") != std::string::npos) return embeddings;
  return true;
}

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<std::string> names, std::vector<bool> decay,
             AdamWOptions o, bool multiTensor)
    : params_(std::move(params)), names_(std::move(names)), decay_(std::move(decay)), o_(o), multiTensor_(multiTensor) {
  TESSERA_CHECK(names_.size() == params_.size() && decay_.size() == params_.size(),
                "AdamW: {} parameters, {} names, {} decay flags", params_.size(), names_.size(), decay_.size());
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
}

void AdamW::step() { step(at::Tensor()); }

void AdamW::step(const at::Tensor& gradScale) {
  kernels::checkGradScale("AdamW::step", gradScale, params_.empty() ? at::Tensor() : params_[0]);
  at::NoGradGuard ng;
  ++step_;
  const auto s = adamwKernelStep(o_, step_), noDecay = adamwKernelStep(o_, step_, false);
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    TESSERA_CHECK(g.defined(), "AdamW: parameter '{}' ({} of {}, {}) has no gradient", names_[i], i, params_.size(),
                  c10::str(params_[i].sizes()));
    grads.push_back(g.is_contiguous() ? g : g.contiguous());
  }
  if (multiTensor_ && !params_.empty() && params_[0].is_cuda()) {
    kernels::multiTensorAdamW(params_, grads, m_, v_, decay_, s, {}, gradScale);
    return;
  }
  if (gradScale.defined()) {
    const auto c = gradScale.reshape({});
    for (auto& g : grads) g.mul_(c);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    kernels::adamwStep(params_[i], grads[i], m_[i], v_[i], decay_[i] ? s : noDecay);
  }
}

}  // namespace tessera::optim
