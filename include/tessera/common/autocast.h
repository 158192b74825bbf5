#pragma once
// Mixed precision at the edge of a custom autograd op: the input cast to the dtype CUDA
// autocast would run the op's GEMMs in, before the op sees it. An op that saves its input for
// backward or communicates it (the column-parallel linear's sequence-parallel all-gather) then
// saves and sends half the bytes, and its results are unchanged (autocast would have cast the
// same input inside at::linear). The cast is an ordinary autograd op, so the input's gradient
// comes back in its own dtype. Nothing happens without CUDA autocast (CPU, LibTorch 1.13, or
// autocast off), for non-floating inputs, or when the dtype already matches.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace tessera {

// The calling thread's CUDA autocast state: activation recomputation (nn/recompute.h) captures
// it with the forward and re-establishes it when it re-runs that forward in backward, on the
// autograd engine's thread (as torch.utils.checkpoint does). LibTorch 1.13: always off.
struct CudaAutocastState {
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
};
inline CudaAutocastState currentCudaAutocast() {
#if TORCH_VERSION_MAJOR >= 2
  return {at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA)};
#else
  return {};
#endif
}

// While alive (and `enabled`): CUDA autocast to `dtype` on this thread (the forward only:
// backward runs on the autograd engine's threads, as under torch.autocast). The destructor
// restores the previous state and clears autocast's cast cache (as leaving torch.autocast
// does). With LibTorch 1.13 (the CPU machine) it does nothing: fp32 throughout.
class CudaAutocast {
 public:
  CudaAutocast(bool enabled, c10::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
    on_ = enabled;
    if (!on_) return;
    prevEnabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prevDtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::increment_nesting();
#else
    (void)enabled;
    (void)dtype;
#endif
  }
  explicit CudaAutocast(const CudaAutocastState& s) : CudaAutocast(s.enabled, s.dtype) {}
  ~CudaAutocast() {
#if TORCH_VERSION_MAJOR >= 2
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, prevEnabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prevDtype_);
#endif
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool on_ = false, prevEnabled_ = false;
  c10::ScalarType prevDtype_ = c10::ScalarType::Float;
};

// CUDA autocast to bf16 while alive (and `enabled`).
class Bf16Autocast : public CudaAutocast {
 public:
  explicit Bf16Autocast(bool enabled = true) : CudaAutocast(enabled, c10::ScalarType::BFloat16) {}
};

// While alive (and `enabled`): autocast's cast cache on this thread outlives the autocast regions
// opened inside it, e.g. the micro-batches of one training step, so each parameter is cast once
// per step instead of once per micro-batch (micro-batches in flight then share one copy). The
// destructor clears the cache once no region is open: end it before the parameters change (the
// optimizer step). Autocast itself stays as the regions inside set it. The cache is autocast's
// one cache, so the scope holds CPU autocast's casts as well (LibTorch 1.13's tests use that).
class CudaAutocastCacheScope {
 public:
  explicit CudaAutocastCacheScope(bool enabled) : on_(enabled) {
    if (on_) at::autocast::increment_nesting();
  }
  ~CudaAutocastCacheScope() {
    if (on_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  CudaAutocastCacheScope(const CudaAutocastCacheScope&) = delete;
  CudaAutocastCacheScope& operator=(const CudaAutocastCacheScope&) = delete;

 private:
  bool on_ = false;
};

// While alive: autocast's cast cache is neither read nor filled on this thread (casts are made
// afresh; any device's autocast), e.g. for a forward without gradients inside a step's
// CudaAutocastCacheScope (the pipeline executor's shape probe). A cast cached there would serve the
// step's real forward: on the GPU image's PyTorch 2.11 (after pytorch/pytorch#165068) with a grad_fn
// made before that forward, whose low sequence number makes autograd run it last in backward, so the
// parameter's gradient (and DDP's ready hook) comes at the very end; before that change (LibTorch
// 1.13's CPU autocast included) with no grad_fn at all, so the parameter got no gradient through it.
class NoAutocastCache {
 public:
  NoAutocastCache() : prev_(at::autocast::is_autocast_cache_enabled()) { at::autocast::set_autocast_cache_enabled(false); }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(prev_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool prev_;
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
