// The load-balanced chunks of context parallelism (contract in chunks.h).
#include "tessera/parallel/context/chunks.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"

namespace tessera::cp {
namespace {
int64_t chunkSize(int64_t T, int cp) {
  TESSERA_CHECK(cp >= 1, "context parallel: cp = {} (must be >= 1)", cp);
  TESSERA_CHECK(T > 0 && T % (2 * cp) == 0,
                "context parallel: the sequence length {} is not divisible by 2 x cp = {} (each of the cp = {} ranks "
                "holds two chunks of equal length)",
                T, 2 * cp, cp);
  return T / (2 * cp);
}
}  // namespace

std::vector<int64_t> chunksOf(int cp, int rank) {
  TESSERA_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context parallel: rank {} of cp = {}", rank, cp);
  return {rank, 2 * cp - 1 - rank};
}

at::Tensor positionsOf(int64_t T, int cp, int rank) {
  const int64_t c = chunkSize(T, cp);
  std::vector<at::Tensor> parts;
  for (int64_t k : chunksOf(cp, rank)) parts.push_back(at::arange(k * c, (k + 1) * c, at::kLong));
  return at::cat(parts);
}

at::Tensor shard(const at::Tensor& x, int64_t dim, int cp, int rank) {
  TESSERA_CHECK(x.defined() && dim >= 0 && dim < x.dim(), "context parallel: no dimension {} to split in a {}-D tensor",
                dim, x.defined() ? x.dim() : 0);
  const int64_t c = chunkSize(x.size(dim), cp);
  std::vector<at::Tensor> parts;
  for (int64_t k : chunksOf(cp, rank)) parts.push_back(x.narrow(dim, k * c, c));
  return at::cat(parts, dim);
}

at::Tensor gatheredToGlobal(int64_t T, int cp) {
  const int64_t c = chunkSize(T, cp);
  // Gathered slot of chunk k: rank r's first chunk (k = r) at slot 2r, its second (k = 2cp-1-r) at 2r+1.
  auto out = at::empty({T}, at::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (int64_t k = 0; k < 2 * cp; ++k) {
    const int64_t slot = k < cp ? 2 * k : 2 * (2 * cp - 1 - k) + 1;
    for (int64_t i = 0; i < c; ++i) p[k * c + i] = slot * c + i;
  }
  return out;
}

}  // namespace tessera::cp
