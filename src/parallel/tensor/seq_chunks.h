#pragma once
// Sequence-parallel all-gather in pieces, so the GEMMs that consume the gathered rows run
// while the rest is still being gathered (used by the column-parallel forward and the
// row-parallel backward with sequence parallel).
//
// The global tensor is the ranks' local [mLocal, f] blocks stacked along dim 0 (rank q's rows
// at [q·mLocal, (q+1)·mLocal)). forEachGatheredBlock splits `local`'s rows into `chunks`
// pieces (as evenly as possible, at most mLocal) and launches every piece's all-gather at once;
// it then calls fn(block, row0) on this rank's own rows piece by piece, which need no
// communication (their GEMMs run while the gathers are in flight), and for each piece in order
// waits for it and calls fn once per other rank: block [rows, f] holds the global rows
// [row0, row0 + rows). So fn sees every global row exactly once, in the same blocks on every
// rank but in a rank-dependent order: a sum over blocks that must come out bitwise equal on
// every rank (a replicated parameter's gradient) adds them up in row0 order afterwards. fn runs on
// the calling thread; on CUDA the blocks are ready on the caller's current stream
// (stream-ordered waits, no host synchronisation).
// While gathers are still in flight, smCarveout SMs are kept free of fn's GEMMs
// (common/sm_carveout.h): on Hopper a GEMM launched beside a collective otherwise takes every SM
// until it ends, and the collective's kernel starts only then.
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
