// MoeImpl::experts: the dispatch, the experts' GEMMs (grouped.h) and the combine (models/moe.h).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "models/moe/exchange.h"
#include "models/moe/grouped.h"
#include "tessera/common/error.h"
#include "tessera/models/moe.h"

namespace tessera::models {

using moe_detail::hostCounts;
using moe_detail::runExperts;  // grouped.h: grouped GEMMs on sm_90, else a per-expert loop

namespace {
// The layer's FP8 setting, its weights' codes cached under the parameters themselves.
moe_detail::ExpertFp8 fp8Of(const MoeImpl& m) { return {m.fp8, m.w1, m.w3, m.w2}; }
}  // namespace

at::Tensor MoeImpl::experts(const at::Tensor& x2, const at::Tensor& chosen, const at::Tensor& weights,
                            at::Tensor counts) {
  const auto& m = cfg_.moe;
  const int64_t n = x2.size(0), k = chosen.size(1), e = m.experts;
  // Training forwards count (with full recompute, the recomputation in backward), not validation or
  // the pipeline's shape probe, which run without autograd.
  const bool counting = at::GradMode::is_enabled();
  auto flat = chosen.reshape(-1);
  // Assignments by expert, in token order within an expert (a stable sort).
  auto order = std::get<1>(at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  if (m.capacityFactor > 0) {  // the first `cap` assignments of each expert, in token order
    const auto cap = static_cast<int64_t>(std::ceil(m.capacityFactor * static_cast<double>(n * k) / e));
    auto starts = at::cumsum(counts, 0) - counts;
    auto pos = at::arange(n * k, flat.options()) - starts.index_select(0, flat.index_select(0, order));
    auto keep = pos < cap;
    if (counting) dropped_ += (n * k) - keep.sum().item<int64_t>();
    order = order.masked_select(keep);
    counts = at::clamp_max(counts, cap);
  }
  if (counting) {
    if (!load_.defined()) load_ = at::zeros({e}, counts.options());
    load_ += counts;
  }
  auto token = at::div(order, k, "floor");
  auto xs = x2.index_select(0, token);
  at::Tensor ys;
  if (!o_.ep || o_.ep->size() == 1) {
    // Counts on the device: no host read.
    ys = runExperts(xs, counts, region(w1), region(w3), region(w2), moe_detail::ExpertGemm::Auto, fp8Of(*this));
  } else {
    const int p = o_.ep->size();
    // [P * El] each: what this rank sends each expert, what each rank sends mine; one host read for both.
    const auto e2 = counts.numel();
    const auto both = hostCounts(at::cat({counts.to(at::kLong), moe_detail::exchangeCounts(counts, o_.ep)}));
    const std::vector<int64_t> mine(both.begin(), both.begin() + e2), theirs(both.begin() + e2, both.end());
    std::vector<int64_t> send(p, 0), recv(p, 0), perExpert(local_, 0);
    for (int q = 0; q < p; ++q) {
      for (int64_t j = 0; j < local_; ++j) {
        send[q] += mine[q * local_ + j];
        recv[q] += theirs[q * local_ + j];
        perExpert[j] += theirs[q * local_ + j];
      }
    }
    auto got = moe_detail::exchangeRows(xs, send, recv, o_.ep);  // [rank][local expert] blocks
    // Regrouped by local expert (rank order within one): the permutation and its inverse.
    std::vector<int64_t> start(p * local_), perm;
    for (int64_t s = 0, i = 0; i < p * local_; ++i) start[i] = s, s += theirs[i];
    for (int64_t j = 0; j < local_; ++j) {
      for (int q = 0; q < p; ++q) {
        for (int64_t r = 0; r < theirs[q * local_ + j]; ++r) perm.push_back(start[q * local_ + j] + r);
      }
    }
    auto permT = at::tensor(perm, at::kLong).to(x2.device());
    // Each expert's weight gradient as the mean over the ep ranks whose tokens it took (exchange.h).
    auto mean = [&](const at::Tensor& w) { return moe_detail::scaleGrad(region(w), 1.0 / p); };
    auto out = runExperts(got.index_select(0, permT), perExpert, mean(w1), mean(w3), mean(w2),
                          moe_detail::ExpertGemm::Auto, fp8Of(*this));
    ys = moe_detail::exchangeRows(out.index_select(0, at::argsort(permT)), recv, send, o_.ep);
  }
  ys = ys * weights.reshape(-1).index_select(0, order).unsqueeze(1).to(ys.scalar_type());
  return at::zeros({n, x2.size(1)}, ys.options()).index_add(0, token, ys);
}

}  // namespace tessera::models
