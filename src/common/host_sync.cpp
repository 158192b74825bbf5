#include "tessera/common/host_sync.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tessera/common/error.h"

#ifdef TESSERA_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera {

namespace detail {
#ifdef TESSERA_TORCH_CUDA
struct DeviceEvent {
  at::cuda::CUDAEvent event{cudaEventDefault};  // timing enabled (StreamMarks)
};
#else
struct DeviceEvent {};
#endif
void DeviceEventDeleter::operator()(DeviceEvent* e) const { delete e; }
}  // namespace detail

namespace {
[[noreturn]] void hostSyncNoCuda(const char* what) {
  throw Error(fmt::format("{}: this tessera was built against a LibTorch without CUDA", what));
}

// An event recorded on `device`'s current stream.
detail::DeviceEventPtr recordOn(const at::Device& device, const char* what) {
#ifdef TESSERA_TORCH_CUDA
  (void)what;
  detail::DeviceEventPtr e(new detail::DeviceEvent);
  e->event.record(c10::cuda::getCurrentCUDAStream(device.index()));
  return e;
#else
  (void)device;
  hostSyncNoCuda(what);
#endif
}
}  // namespace

void Readback::queue(const at::Tensor& src) {
  TESSERA_CHECK(src.defined(), "Readback: queued an undefined tensor");
  if (!src.is_cuda()) {
    host_ = src.clone();
    done_.reset();
    return;
  }
  host_ = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
  host_.copy_(src, /*non_blocking=*/true);
  done_ = recordOn(src.device(), "Readback");
}

at::Tensor Readback::get() {
  TESSERA_CHECK(host_.defined(), "Readback: get() with nothing queued");
#ifdef TESSERA_TORCH_CUDA
  if (done_) done_->event.synchronize();
#endif
  done_.reset();
  return host_;
}

int StreamMarks::mark() {
  if (device_.is_cuda()) {
    events_.push_back(recordOn(device_, "StreamMarks"));
  } else {
    host_.push_back(std::chrono::steady_clock::now());
  }
  return static_cast<int>(std::max(events_.size(), host_.size())) - 1;
}

double StreamMarks::ms(int a, int b) {
  const int n = static_cast<int>(std::max(events_.size(), host_.size()));
  TESSERA_CHECK(a >= 0 && b >= 0 && a < n && b < n, "StreamMarks: marks {} and {} asked, {} made", a, b, n);
  if (!device_.is_cuda()) return std::chrono::duration<double, std::milli>(host_[b] - host_[a]).count();
#ifdef TESSERA_TORCH_CUDA
  events_[b]->event.synchronize();
  return events_[a]->event.elapsed_time(events_[b]->event);
#else
  hostSyncNoCuda("StreamMarks");
#endif
}

double StreamMarks::msFrom(const StreamMarks& earlier, int a, int b) {
  TESSERA_CHECK(earlier.device_ == device_ && a >= 0 && b >= 0 && a < earlier.marks() && b < marks(),
                "StreamMarks: mark {} of an earlier set ({} made) and mark {} ({} made) asked", a, earlier.marks(), b,
                marks());
  if (!device_.is_cuda()) return std::chrono::duration<double, std::milli>(host_[b] - earlier.host_[a]).count();
#ifdef TESSERA_TORCH_CUDA
  events_[b]->event.synchronize();
  return earlier.events_[a]->event.elapsed_time(events_[b]->event);
#else
  hostSyncNoCuda("StreamMarks");
#endif
}

const char* toString(SyncDebug s) {
  switch (s) {
    case SyncDebug::Off: return "off";
    case SyncDebug::Warn: return "warn";
    case SyncDebug::Error: return "error";
  }
  return "?";
}

SyncCheck::SyncCheck(const at::Device& device, SyncDebug level) {
  if (!device.is_cuda()) return;
#ifdef TESSERA_TORCH_CUDA
  using Mode = c10::cuda::SyncDebugMode;
  auto& state = c10::cuda::warning_state();
  previous_ = static_cast<int>(state.get_sync_debug_mode());
  state.set_sync_debug_mode(level == SyncDebug::Off    ? Mode::L_DISABLED
                            : level == SyncDebug::Warn ? Mode::L_WARN
                                                       : Mode::L_ERROR);
  active_ = true;
#else
  if (level != SyncDebug::Off) hostSyncNoCuda("SyncCheck");
#endif
}

SyncCheck::~SyncCheck() {
#ifdef TESSERA_TORCH_CUDA
  if (active_) c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_));
#endif
}

}  // namespace tessera
