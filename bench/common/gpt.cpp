// GPT-735M for the benchmarks; see gpt.h.
#include "gpt.h"

#include <torch/version.h>

#include <cmath>

#include "common/attention.h"
#include "common/error.h"
#include "nn/accum_linear.h"

namespace tessera::bench {

int64_t gptParamCount(const GptConfig& c) {
  return c.layers * (12 * c.d * c.d + 13 * c.d) + 2 * c.vocab * c.d + 2 * c.d;
}

double gptFlopsPerToken(const GptConfig& c) {
  return 6.0 * static_cast<double>(gptParamCount(c)) + 12.0 * c.layers * c.d * c.seqLen;
}

BenchBlockImpl::BenchBlockImpl(int64_t d, int64_t h) : heads(h) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
  proj = register_module("proj", torch::nn::Linear(d, d));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
  fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
}

torch::Tensor linear(const torch::nn::Linear& l, const torch::Tensor& x, bool accumulateGrad) {
  return accumulateGrad ? nn::linearAccumulateGrad(x, l->weight, l->bias) : at::linear(x, l->weight, l->bias);
}

torch::Tensor BenchBlockImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const bool acc = accumulateGrad;
  auto parts = linear(qkv, ln1->forward(x), acc).view({b, t, 3, heads, d / heads}).unbind(2);
  auto a = causalSelfAttention(parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2));
  auto y = x + linear(proj, a.transpose(1, 2).reshape({b, t, d}), acc);
  return y + linear(fc2, torch::gelu(linear(fc1, ln2->forward(y), acc)), acc);
}

BenchGptImpl::BenchGptImpl(const GptConfig& c) : cfg(c) {
  emb = register_module("emb", torch::nn::Embedding(c.vocab, c.d));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(BenchBlock(c.d, c.heads));
  lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
  head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d, c.vocab).bias(false)));
}

torch::Tensor BenchGptImpl::forward(const torch::Tensor& tokens) {
  auto x = emb->forward(tokens);
  for (const auto& blk : *blocks) x = blk->as<BenchBlock>()->forward(x);
  return linear(head, lnf->forward(x), accumulateGrad);
}

void BenchGptImpl::setAccumulateGrad(bool on) {
  accumulateGrad = on;
  for (const auto& blk : *blocks) blk->as<BenchBlock>()->accumulateGrad = on;
}

torch::Tensor gptLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.flatten(0, 1).to(torch::kFloat32), targets.flatten());
}

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, double lr, double beta1, double beta2, double eps,
                       double weightDecay)
    : params_(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), wd_(weightDecay) {}

void FusedAdamW::step() {
  std::vector<size_t> all(params_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  stepIndices(all);
}

void FusedAdamW::step(const std::vector<torch::Tensor>& subset) {
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
  torch::NoGradGuard ng;
  if (expAvg_.empty()) {
    for (auto& p : params_) {
      expAvg_.push_back(torch::zeros_like(p, at::MemoryFormat::Preserve));
      expAvgSq_.push_back(torch::zeros_like(p, at::MemoryFormat::Preserve));
      steps_.push_back(torch::zeros({}, p.options().dtype(torch::kFloat32)));
    }
  }
  std::vector<torch::Tensor> ps, gs, ms, vs, ss;
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
