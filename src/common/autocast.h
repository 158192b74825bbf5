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

// While alive (and `enabled`): CUDA autocast to bf16 on this thread (the forward only:
// backward runs on the autograd engine's threads, as under torch.autocast). The destructor
// restores the previous state and clears autocast's cast cache (as leaving torch.autocast
// does). With LibTorch 1.13 (the CPU machine) it does nothing: fp32 throughout.
class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool enabled = true) {
#if TORCH_VERSION_MAJOR >= 2
    on_ = enabled;
    if (!on_) return;
    prevEnabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prevDtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::increment_nesting();
#else
    (void)enabled;
#endif
  }
  ~Bf16Autocast() {
#if TORCH_VERSION_MAJOR >= 2
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, prevEnabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prevDtype_);
#endif
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;

 private:
  bool on_ = false, prevEnabled_ = false;
  c10::ScalarType prevDtype_ = c10::ScalarType::Float;
};

// A parameter (a float32 leaf that requires grad) in the CUDA autocast dtype through autocast's
// cast cache, as at::linear under autocast gets it: one cast per parameter per autocast region,
// shared with every op that uses the parameter; the cast is recorded by autograd like autocast's.
// Unchanged where castForCudaAutocast would leave it unchanged.
inline at::Tensor castParamForCudaAutocast(const at::Tensor& w) {
#if TORCH_VERSION_MAJOR >= 2
  if (w.is_cuda() && at::isFloatingType(w.scalar_type()) && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dt = at::autocast::get_autocast_dtype(at::kCUDA);
    if (w.scalar_type() != dt) return at::autocast::cached_cast(dt, w, at::kCUDA);
  }
#endif
  return w;
}

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
