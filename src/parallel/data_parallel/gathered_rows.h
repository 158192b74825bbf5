#pragma once
// DDP's and FSDP's gatherEmbeddingRows: the gradient rows an embedding lookup offered
// (nn/accum_embedding.h's sink), all-gathered over a group.
//
// gatherRows: collective over `comm`, every rank offering the same number of ids; asynchronous
// (wait(): on CUDA the caller's current stream waits, no host synchronisation). The ids travel as
// float32, exact below 2^24 rows (the callers refuse larger tables when they install the sinks).
#include <ATen/core/Tensor.h>

#include "tessera/comm/communicator.h"

namespace tessera {

struct GatheredRows {
  at::Tensor ids;   // every rank's ids, rank by rank: float32 [world·n]
  at::Tensor rows;  // every rank's rows: [world·n, dim] in the offered dtype
  WorkPtr idsWork, rowsWork;
  void wait() const;
};

GatheredRows gatherRows(const CommPtr& comm, const at::Tensor& ids, const at::Tensor& rows);

}  // namespace tessera
