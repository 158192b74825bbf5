#pragma once
// Internal: AdamWOptions as the AdamW kernels' arguments (optim/adamw.cpp, FSDP's ShardedAdamW).
#include "kernels/adamw.h"
#include "tessera/optim/adamw.h"

namespace tessera {

// The kernel's arguments for step number `step` of `o`, with its weight decay or none.
inline kernels::AdamWStep adamwKernelStep(const AdamWOptions& o, int64_t step, bool decay = true) {
  return {o.lr, o.beta1, o.beta2, o.eps, decay ? o.weightDecay : 0.0, step};
}

}  // namespace tessera
