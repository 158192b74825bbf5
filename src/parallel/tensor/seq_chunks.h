#pragma once
// Sequence-parallel all-gather in pieces, so the GEMMs that consume the gathered rows run
// while the rest is still being gathered (used by the column-parallel forward and the
// row-parallel backward with sequence parallel).
//
// The global tensor is the ranks' local [mLocal, f] blocks stacked along dim 0 (rank q's rows
// at [q·mLocal, (q+1)·mLocal)). forEachGatheredBlock splits `local`'s rows into `chunks`
// pieces (as evenly as possible, at most mLocal), launches every piece's all-gather at once,
// then for each piece in order waits for it and calls fn(block, row0) once per rank: block
// [rows, f] holds the global rows [row0, row0 + rows). With chunks == 1 it gathers once and
// calls fn(all rows, 0). fn runs on the calling thread; on CUDA the blocks are ready on the
// caller's current stream (stream-ordered waits, no host synchronisation).
// While pieces are still in flight, smCarveout SMs are kept free of fn's GEMMs
// (common/sm_carveout.h).
// Collective over comm: every rank calls it with the same mLocal, f, dtype and chunks.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"

namespace tessera::tp {

void forEachGatheredBlock(const at::Tensor& local, const CommPtr& comm, int chunks, int smCarveout,
                          const std::function<void(const at::Tensor& block, int64_t row0)>& fn);

// Sizes of `chunks` near-equal pieces of n (at least 1 each, at most n pieces).
std::vector<int64_t> pieceSizes(int64_t n, int chunks);

}  // namespace tessera::tp
