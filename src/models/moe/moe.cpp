#include "tessera/models/moe.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "models/moe/exchange.h"
#include "models/moe/router.h"
#include "tessera/common/error.h"
#include "tessera/models/block.h"
#include "tessera/nn/init.h"
#include "tessera/parallel/tensor/mappings.h"

namespace tessera::models {

namespace {
// Expert e's tensor j (0: w1, 1: w3, 2: w2) of layer `layer`: its own seed, so any ep draws the same.
uint64_t expertSeed(uint64_t seed, int64_t layer, int64_t e, int j) {
  return (blockSeed(seed, layer) * 16ull + 12ull) * 1000003ull + static_cast<uint64_t>(e) * 3ull + j;
}

// Experts [first, first + count) of layer `layer`, with the router and the shared expert.
std::map<std::string, at::Tensor> draw(const ModelConfig& c, int64_t layer, uint64_t seed, int64_t first,
                                       int64_t count) {
  const uint64_t base = blockSeed(seed, layer) * 16ull;
  const int64_t d = c.d, f = c.expertFfn(), fs = c.moe.sharedFfn;
  const double std = 0.02, out = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  std::map<std::string, at::Tensor> w;
  w["router.weight"] = nn::seededNormal(c.moe.experts, d, 0, std, base + 8);
  std::vector<at::Tensor> e1, e3, e2;
  for (int64_t e = first; e < first + count; ++e) {
    e1.push_back(nn::seededNormal(f, d, 0, std, expertSeed(seed, layer, e, 0)));
    e3.push_back(nn::seededNormal(f, d, 0, std, expertSeed(seed, layer, e, 1)));
    e2.push_back(nn::seededNormal(d, f, 0, out, expertSeed(seed, layer, e, 2)));
  }
  w["w1.weight"] = at::stack(e1), w["w3.weight"] = at::stack(e3), w["w2.weight"] = at::stack(e2);
  if (fs > 0) {
    w["shared.w1.weight"] = nn::seededNormal(fs, d, 0, std, base + 9);
    w["shared.w3.weight"] = nn::seededNormal(fs, d, 0, std, base + 10);
    w["shared.w2.weight"] = nn::seededNormal(d, fs, 0, out, base + 11);
  }
  return w;
}

at::Tensor swiglu(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2) {
  return at::linear(at::silu(at::linear(x, w1)) * at::linear(x, w3), w2);
}
}  // namespace

std::map<std::string, at::Tensor> moeInit(const ModelConfig& c, int64_t layer, uint64_t seed) {
  return draw(c, layer, seed, 0, c.moe.experts);
}

MoeImpl::MoeImpl(const ModelConfig& c, int64_t layer, MoeOptions o)
    : cfg_(c), o_(std::move(o)), name_(fmt::format("blocks.{}.moe", layer)) {
  const auto& m = c.moe;
  const int p = o_.ep ? o_.ep->size() : 1;
  TESSERA_CHECK(m.experts > 0 && m.experts % p == 0,
                "{}: {} experts do not split evenly over the expert-parallel size {}", name_, m.experts, p);
  local_ = m.experts / p;
  first_ = (o_.ep ? o_.ep->rank() : 0) * local_;
  auto w = draw(c, layer, o_.seed, first_, local_);
  router = register_parameter("router", w.at("router.weight"));
  w1 = register_parameter("w1", w.at("w1.weight"));
  w3 = register_parameter("w3", w.at("w3.weight"));
  w2 = register_parameter("w2", w.at("w2.weight"));
  if (m.sharedFfn > 0) {
    sw1 = register_parameter("shared_w1", w.at("shared.w1.weight"));
    sw3 = register_parameter("shared_w3", w.at("shared.w3.weight"));
    sw2 = register_parameter("shared_w2", w.at("shared.w2.weight"));
  }
  bias = register_buffer("bias", at::zeros({m.experts}));
}

void MoeImpl::loadFull(const std::map<std::string, at::Tensor>& full, const std::string& prefix) {
  auto get = [&](const std::string& n, const at::Tensor& like, bool experts) {
    auto it = full.find(prefix + n);
    TESSERA_CHECK(it != full.end(), "{}: loadFull: no tensor '{}{}'", name_, prefix, n);
    const bool all = experts && it->second.dim() == 3 && it->second.size(0) == cfg_.moe.experts;
    auto t = all ? it->second.narrow(0, first_, local_) : it->second;
    TESSERA_CHECK(t.sizes() == like.sizes(), "{}: loadFull: '{}{}' is [{}], expected [{}]{}", name_, prefix, n,
                  fmt::join(it->second.sizes(), ", "), fmt::join(like.sizes(), ", "),
                  experts ? fmt::format(" (experts {}..{} of it)", first_, first_ + local_ - 1) : "");
    return t;
  };
  at::NoGradGuard ng;
  router.copy_(get("router.weight", router, false));
  w1.copy_(get("w1.weight", w1, true));
  w3.copy_(get("w3.weight", w3, true));
  w2.copy_(get("w2.weight", w2, true));
  if (sw1.defined()) {
    sw1.copy_(get("shared.w1.weight", sw1, false));
    sw3.copy_(get("shared.w3.weight", sw3, false));
    sw2.copy_(get("shared.w2.weight", sw2, false));
  }
  auto b = full.find(prefix + "router.bias");
  if (b != full.end()) bias.copy_(b->second);
}

std::vector<NamedParam> MoeImpl::params(const std::string& p) {
  std::vector<NamedParam> out{{p + "router.weight", router, true}};
  for (auto& [n, t] : {std::pair{"w1.weight", w1}, {"w3.weight", w3}, {"w2.weight", w2}}) {
    out.push_back({p + n, t, true});
    out.back().expert = o_.ep && o_.ep->size() > 1;
  }
  if (sw1.defined()) {
    for (auto& [n, t] : {std::pair{"shared.w1.weight", sw1}, {"shared.w3.weight", sw3}, {"shared.w2.weight", sw2}}) {
      out.push_back({p + n, t, true});
    }
  }
  return out;
}

std::vector<checkpoint::Piece> MoeImpl::pieces(const std::string& p) {
  const int64_t e = cfg_.moe.experts;
  auto box = [&](const char* n, const at::Tensor& t) {
    return checkpoint::Piece{p + n, {e, t.size(1), t.size(2)}, {first_, 0, 0}, t.detach()};
  };
  std::vector<checkpoint::Piece> out{checkpoint::whole(p + "router.weight", router.detach()),
                                     {p + "router.bias", {e}, {0}, bias, true},
                                     box("w1.weight", w1),
                                     box("w3.weight", w3),
                                     box("w2.weight", w2)};
  if (sw1.defined()) {
    out.push_back(checkpoint::whole(p + "shared.w1.weight", sw1.detach()));
    out.push_back(checkpoint::whole(p + "shared.w3.weight", sw3.detach()));
    out.push_back(checkpoint::whole(p + "shared.w2.weight", sw2.detach()));
  }
  return out;
}

at::Tensor MoeImpl::forward(const at::Tensor& x) {
  const auto& m = cfg_.moe;
  TESSERA_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == cfg_.d, "{}: input must be [..., {}], got [{}]", name_,
                cfg_.d, x.defined() ? c10::str(x.sizes()) : "undefined");
  auto x2 = x.reshape({-1, cfg_.d});
  auto r = moe_detail::route(x2, region(router), m.biasUpdateRate > 0 ? bias : at::Tensor(), m, o_.forceBalanced);
  auto y = experts(x2, r.chosen, r.weights, r.counts);
  if (sw1.defined()) y = y + swiglu(x2, region(sw1), region(sw3), region(sw2));
  tokens_ += x2.size(0);
  if (m.auxLossCoef > 0 || m.zLossCoef > 0) {
    auto aux = moe_detail::balanceLoss(r, m), z = moe_detail::zLoss(r);
    aux_ = aux.detach(), z_ = z.detach();
    auto total = (m.auxLossCoef * aux + m.zLossCoef * z) * o_.lossScale;
    if (at::GradMode::is_enabled()) y = moe_detail::attachLoss(y, total);
  }
  return y.reshape(x.sizes());
}

at::Tensor MoeImpl::region(const at::Tensor& w) const {
  return o_.sequenceParallel && o_.tp && o_.tp->size() > 1 ? tp::copyToRegion(w, o_.tp) : w;
}

MoeStats MoeImpl::takeStats() {
  MoeStats s{load_.defined() ? load_.cpu().clone() : at::zeros({cfg_.moe.experts}, at::kLong), dropped_, tokens_,
             aux_.defined() ? aux_.item<double>() : 0.0, z_.defined() ? z_.item<double>() : 0.0};
  resetLoad();
  return s;
}

at::Tensor MoeImpl::statsOnDevice() const {
  const auto opt = at::TensorOptions().dtype(at::kFloat).device(router.device());
  auto load = load_.defined() ? load_.to(at::kFloat) : at::zeros({cfg_.moe.experts}, opt);
  auto scalar = [&](const at::Tensor& t) { return t.defined() ? t.reshape({1}).to(at::kFloat) : at::zeros({1}, opt); };
  return at::cat({load, scalar(aux_), scalar(z_), at::full({1}, static_cast<double>(dropped_), opt)});
}

void MoeImpl::resetLoad() {
  if (load_.defined()) load_.zero_();
  dropped_ = tokens_ = 0;
}

void MoeImpl::updateBias(const std::vector<CommPtr>& groups) {
  auto load = (load_.defined() ? load_ : at::zeros({cfg_.moe.experts}, at::kLong).to(bias.device())).to(at::kFloat);
  for (const auto& g : groups) {
    if (g && g->size() > 1) g->allReduce(load)->wait();
  }
  updateBiasFrom(load);
}

void MoeImpl::updateBiasFrom(const at::Tensor& summedLoad) {
  TESSERA_CHECK(summedLoad.numel() == cfg_.moe.experts, "{}: updateBiasFrom: a load of {} experts, the layer has {}",
                name_, summedLoad.numel(), cfg_.moe.experts);
  if (cfg_.moe.biasUpdateRate > 0) {
    at::NoGradGuard ng;
    const auto load = summedLoad.reshape({-1}).to(bias.device(), at::kFloat);
    bias.add_(at::sign(load.mean() - load) * cfg_.moe.biasUpdateRate);
  }
  resetLoad();
}

}  // namespace tessera::models
