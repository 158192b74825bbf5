#pragma once
// Mixed precision at the edge of a custom autograd op: the input cast to the dtype CUDA
// autocast would run the op's GEMMs in, before the op sees it. An op that saves its input for
// backward or communicates it (the column-parallel linear's sequence-parallel all-gather) then
// saves and sends half the bytes, and its results are unchanged (autocast would have cast the
// same input inside at::linear). The cast is an ordinary autograd op, so the input's gradient
// comes back in its own dtype. Nothing happens without CUDA autocast (CPU, LibTorch 1.13, or
// autocast off), for non-floating inputs, or when the dtype already matches.
#include <ATen/ATen.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <ATen/autocast_mode.h>
#endif

namespace tessera {

inline at::Tensor castForCudaAutocast(const at::Tensor& x) {
#if TORCH_VERSION_MAJOR >= 2
  if (x.is_cuda() && at::isFloatingType(x.scalar_type()) && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dt = at::autocast::get_autocast_dtype(at::kCUDA);
    if (x.scalar_type() != dt) return x.to(dt);
  }
#endif
  return x;
}

}  // namespace tessera
