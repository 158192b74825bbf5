#pragma once
// Keeping the host off the device's critical path: a training step queues its work and reads
// its results (loss, gradient norm, timings) later, without a device-wide synchronization.
// Local (no communication); work on the caller's current stream.
// - Readback: queue(t) copies `t` into host memory — pinned, on the current stream, an event
//   after the copy — and returns at once; get() blocks the host on that event only (the work
//   queued before the copy, not what was queued after) and returns the host tensor. The source
//   may be freed or overwritten after queue(). On the CPU the copy is made in queue().
// - StreamMarks: mark() records a point in the current stream's timeline (CUDA: a timing event;
//   CPU: the host clock); ms(a, b) blocks on mark b and returns the milliseconds between marks
//   a and b (msFrom: from mark a of an earlier StreamMarks of the same stream). On CUDA that is
//   the stream's time: a mark made while the stream is busy falls when the stream reaches it.
// - SyncCheck: while alive, a host synchronization with a CUDA device through PyTorch (item(),
//   a copy to the host, a blocking copy from pageable memory, a stream or device synchronize)
//   warns (SyncDebug::Warn) or throws (Error), as torch.cuda.set_sync_debug_mode; SyncDebug::Off
//   lets an expected one pass inside a checked scope. Restores the previous mode when destroyed.
//   Process-wide; nothing on the CPU.
// Errors: a CUDA tensor or device in a build without a CUDA LibTorch, get() with nothing
// queued, ms() of a mark not made are tessera::Error.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <vector>

namespace tessera {

namespace detail {
struct DeviceEvent;  // a CUDA event (host_sync.cpp)
struct DeviceEventDeleter {
  void operator()(DeviceEvent* e) const;
};
using DeviceEventPtr = std::unique_ptr<DeviceEvent, DeviceEventDeleter>;
}  // namespace detail

class Readback {
 public:
  void queue(const at::Tensor& src);
  bool queued() const { return host_.defined(); }
  at::Tensor get();

 private:
  at::Tensor host_;
  detail::DeviceEventPtr done_;
};

class StreamMarks {
 public:
  explicit StreamMarks(at::Device device = at::kCPU) : device_(device) {}
  int mark();  // the mark's index: 0, 1, ...
  double ms(int a, int b);
  double msFrom(const StreamMarks& earlier, int a, int b);
  int marks() const { return static_cast<int>(events_.size() + host_.size()); }

 private:
  at::Device device_;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::vector<detail::DeviceEventPtr> events_;
};

enum class SyncDebug { Off, Warn, Error };
const char* toString(SyncDebug s);  // "off" | "warn" | "error"

class SyncCheck {
 public:
  SyncCheck(const at::Device& device, SyncDebug level);
  ~SyncCheck();
  SyncCheck(const SyncCheck&) = delete;
  SyncCheck& operator=(const SyncCheck&) = delete;

 private:
  bool active_ = false;
  int previous_ = 0;
};

}  // namespace tessera
