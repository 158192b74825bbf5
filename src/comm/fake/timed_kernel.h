#pragma once
// Internal: the spin kernel of the timed fake communicator (timed_kernel.cu).
#include <cuda_runtime_api.h>

namespace tessera::fake_detail {

// Enqueues on `stream` a kernel that runs for `ns` nanoseconds on `ctas` blocks, each holding a
// whole SM of `device` (its shared memory); ctas <= 0: one block of one warp, no SM held.
cudaError_t launchSpin(cudaStream_t stream, unsigned long long ns, int ctas, int device);

}  // namespace tessera::fake_detail
