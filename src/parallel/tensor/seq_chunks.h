#pragma once
// forEachGatheredBlock: a sequence-parallel all-gather in pieces, so the GEMMs consuming gathered
// rows run while the rest is in flight (the column-parallel forward and the row-parallel backward
// with sequence parallel). The global tensor is the ranks' [mLocal, f] blocks stacked along dim 0.
// `local`'s rows split into `chunks` pieces (at most mLocal) whose all-gathers all launch at once;
// fn(block, row0) runs first on this rank's own pieces (no communication), then per piece in order,
// after its wait, once per other rank: block [rows, f] holds global rows [row0, row0 + rows).
// fn sees every global row once, in a rank-dependent order: a sum that must be bitwise equal on
// every rank (a replicated parameter's gradient) adds the blocks up in row0 order afterwards.
// fn runs on the calling thread; on CUDA the blocks are ready on the caller's current stream (no
// host sync). While gathers are in flight, smCarveout SMs are kept free of fn's GEMMs.
// Collective over comm: every rank calls it with the same mLocal, f, dtype and chunks.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::tp {

void forEachGatheredBlock(const at::Tensor& local, const CommPtr& comm, int chunks, int smCarveout,
                          const std::function<void(const at::Tensor& block, int64_t row0)>& fn);

// Sizes of `chunks` near-equal pieces of n (at least 1 each, at most n pieces).
std::vector<int64_t> pieceSizes(int64_t n, int chunks);

}  // namespace tessera::tp
