#include "parallel/tensor/seq_chunks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "tessera/common/error.h"
#include "tessera/common/sm_carveout.h"

namespace tessera::tp {

std::vector<int64_t> pieceSizes(int64_t n, int chunks) {
  const int64_t c = std::max<int64_t>(1, std::min<int64_t>(chunks, n));
  std::vector<int64_t> sizes;
  for (int64_t i = 0, done = 0; i < c; ++i) {
    sizes.push_back((n - done) / (c - i));
    done += sizes.back();
  }
  return sizes;
}

void forEachGatheredBlock(const at::Tensor& local, const CommPtr& comm, int chunks, int smCarveout,
                          const std::function<void(const at::Tensor& block, int64_t row0)>& fn) {
  TESSERA_CHECK(local.dim() == 2 && local.is_contiguous(),
                "tp::forEachGatheredBlock: expects a contiguous 2-D [rows, features] tensor (rank {})", comm->rank());
  const int64_t mLocal = local.size(0), f = local.size(1), p = comm->size(), me = comm->rank();
  const auto sizes = pieceSizes(mLocal, chunks);
  // Launch every piece's gather first: they run back to back on the communicator.
  std::vector<at::Tensor> gathered;
  std::vector<WorkPtr> works;
  for (int64_t i = 0, r0 = 0; i < static_cast<int64_t>(sizes.size()); r0 += sizes[i], ++i) {
    gathered.push_back(at::empty({p * sizes[i], f}, local.options()));
    works.push_back(comm->allGather(gathered.back(), local.narrow(0, r0, sizes[i])));
  }
  // This rank's own rows need no communication: their GEMMs run while the gathers are in flight
  // (with SMs left to the collective).
  std::optional<SmCarveoutGuard> carve;
  carve.emplace(smCarveout);
  for (int64_t i = 0, r0 = 0; i < static_cast<int64_t>(sizes.size()); r0 += sizes[i], ++i)
    fn(local.narrow(0, r0, sizes[i]), me * mLocal + r0);
  for (int64_t i = 0, r0 = 0; i < static_cast<int64_t>(sizes.size()); r0 += sizes[i], ++i) {
    works[i]->wait();
    if (i + 1 == static_cast<int64_t>(sizes.size())) carve.reset();  // nothing left in flight
    for (int64_t q = 0; q < p; ++q) {
      if (q != me) fn(gathered[i].narrow(0, q * sizes[i], sizes[i]), q * mLocal + r0);
    }
  }
}

}  // namespace tessera::tp
