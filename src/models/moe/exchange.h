#pragma once
// Expert-parallel transport (models/moe.h): rows of a [n, d] tensor exchanged within the ep group
// by point-to-point transfers whose sizes each side knows. Collective over `ep` (every rank calls
// with its own sizes; send[q] on rank p equals recv[p] on rank q). Streams: as Communicator's
// batchP2P; the caller waits (Work::wait) before returning. Errors: tessera::Error naming the op,
// the rank and the sizes when send does not add up to x's rows.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::models::moe_detail {

// Counts [P * El] int64 (this rank's assignments to every expert, in expert order) → [P * El]:
// what each rank p sends to this rank's El experts, at [p * El + e]. Collective (all-to-all).
at::Tensor exchangeCounts(const at::Tensor& counts, const CommPtr& ep);

// Rows [send[0] for rank 0 | send[1] for rank 1 | ...] → rows received [recv[0] from rank 0 | ...].
// Differentiable: its backward is the reverse exchange of the gradient.
at::Tensor exchangeRows(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                        const CommPtr& ep);

// x itself, its gradient multiplied by `factor` (an expert's weights under ep of P ranks: 1/P, so
// that the expert-data group's average of what this rank's tokens and its peers' gave it is the
// data group's mean, as a replicated weight's). Local.
at::Tensor scaleGrad(const at::Tensor& x, double factor);

}  // namespace tessera::models::moe_detail
