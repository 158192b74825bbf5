#pragma once
// Internal: the spin kernel of the timed fake communicator (timed_kernel.cu).
#include <cuda_runtime_api.h>

namespace tessera::fake_detail {

// Enqueues on `stream` a kernel that runs for `ns` nanoseconds on `ctas` blocks, each holding a
// whole SM of `device` (its shared memory); ctas <= 0: one block of one warp, no SM held.
// With `scratch` (2 * scratchBytes of device memory, ctas > 0) the blocks copy its first half
// into its second over and over for that time instead of sleeping: memory traffic and power as
// a collective's kernel spends them.
cudaError_t launchSpin(cudaStream_t stream, unsigned long long ns, int ctas, int device, void* scratch = nullptr,
                       size_t scratchBytes = 0);

}  // namespace tessera::fake_detail
