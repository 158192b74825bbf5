#pragma once
// The collective conformance checks, run inside a worker against any communicator: every
// op, every dtype, odd sizes, compared with hand-computed results. Throws on a mismatch.
#include "tessera/comm/communicator.h"

namespace tessera::testing {

// `opts` places tensors on the communicator's device (CPU for Gloo, CUDA for NCCL).
void runCollectiveSuite(Communicator& comm, const at::TensorOptions& opts);

}  // namespace tessera::testing
