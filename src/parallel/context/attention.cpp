// Context-parallel attention by gathered K and V (contract in attention.h).
#include "parallel/context/attention.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/attention.h"
#include "common/error.h"
#include "parallel/context/chunks.h"
#include "parallel/tensor/mappings.h"

namespace tessera::cp {
namespace {
// [S, B, H, D] → [B, H·rep, S, D], each head repeated rep times (grouped-query attention).
at::Tensor headsFirst(const at::Tensor& x, int64_t rep) {
  auto y = x.permute({1, 2, 0, 3});
  if (rep == 1) return y;
  const int64_t b = y.size(0), h = y.size(1), s = y.size(2), d = y.size(3);
  return y.unsqueeze(2).expand({b, h, rep, s, d}).reshape({b, h * rep, s, d});
}
}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CommPtr& group) {
  TESSERA_CHECK(group, "context-parallel attention: no cp communicator given");
  TESSERA_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() &&
                    q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) && k.size(2) > 0 &&
                    q.size(2) % k.size(2) == 0,
                "context-parallel attention (rank {} of cp {}): needs q [T/cp, B, Hq, D] and k, v [T/cp, B, Hkv, D] "
                "with Hq a multiple of Hkv; got q {}, k {}, v {}",
                group->rank(), group->size(), q.defined() ? c10::str(q.sizes()) : "undefined",
                k.defined() ? c10::str(k.sizes()) : "undefined", v.defined() ? c10::str(v.sizes()) : "undefined");
  const int n = group->size(), r = group->rank();
  const int64_t local = q.size(0), T = local * n;
  TESSERA_CHECK(local % 2 == 0, "context-parallel attention (rank {} of cp {}): {} local positions are not two chunks",
                r, n, local);
  const int64_t c = local / 2, rep = q.size(2) / k.size(2);
  // Every rank's k and v, reordered from rank order to global positions.
  const auto order = gatheredToGlobal(T, n).to(q.device());
  const auto kAll = tp::gatherSeq(k.contiguous(), group).index_select(0, order);
  const auto vAll = tp::gatherSeq(v.contiguous(), group).index_select(0, order);
  std::vector<at::Tensor> outs;
  const auto chunks = chunksOf(n, r);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t first = chunks[i] * c, keys = first + c;  // this chunk's positions; the keys up to its end
    auto qc = q.narrow(0, static_cast<int64_t>(i) * c, c).permute({1, 2, 0, 3});  // [B, Hq, c, D]
    auto kc = headsFirst(kAll.narrow(0, 0, keys), rep), vc = headsFirst(vAll.narrow(0, 0, keys), rep);
    // Query i (global first + i) sees keys j <= first + i.
    auto allowed = at::arange(keys, q.options().dtype(at::kLong)).unsqueeze(0) <=
                   at::arange(first, keys, q.options().dtype(at::kLong)).unsqueeze(1);
    outs.push_back(maskedSelfAttention(qc, kc, vc, allowed).permute({2, 0, 1, 3}));  // [c, B, Hq, D]
  }
  return at::cat(outs, 0);
}

}  // namespace tessera::cp
