#pragma once
// Keeping the host off the device's critical path: a training step queues its work and reads its
// results (loss, gradient norm, timings) later, without a device-wide synchronization.
// Local (no communication). Work goes on the caller's current stream; each object owns its host
// copies and events. Errors (tessera::Error): a CUDA tensor or device in a build without a CUDA
// LibTorch, get() with nothing queued, ms() of a mark not made.
// Why: docs/design.md ("Streams, not syncs").
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

// A tensor's values read back later.
// Example:
//   tessera::Readback loss;  // the previous step's loss, read once this step is queued
//   for (int step = 0; step < steps; ++step) {
//     at::Tensor l = lossFn(model->forward(tokens), targets);
//     l.backward();
//     if (loss.queued()) tessera::log::info("loss {}", loss.get().item<double>());
//     loss.queue(l.detach());
//   }
class Readback {
 public:
  // Copies `src` into pinned host memory on the current stream, an event after the copy, and
  // returns at once; `src` may then be freed or overwritten (by work on that stream). On the CPU
  // the copy is made here.
  void queue(const at::Tensor& src);
  bool queued() const { return host_.defined(); }
  // Blocks the host on that event only (not on work queued after the copy); the host tensor.
  at::Tensor get();

 private:
  at::Tensor host_;
  detail::DeviceEventPtr done_;
};

// Points in the current stream's timeline of `device` (CUDA: timing events; CPU: the host clock).
// On CUDA the time is the stream's: a mark made while the stream is busy falls when it reaches it.
class StreamMarks {
 public:
  explicit StreamMarks(at::Device device = at::kCPU) : device_(device) {}
  int mark();  // the mark's index: 0, 1, ...
  // Blocks on mark b; the milliseconds from mark a to mark b.
  double ms(int a, int b);
  // As ms(), from mark a of an earlier StreamMarks of the same device.
  double msFrom(const StreamMarks& earlier, int a, int b);
  int marks() const { return static_cast<int>(events_.size() + host_.size()); }

 private:
  at::Device device_;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::vector<detail::DeviceEventPtr> events_;
};

enum class SyncDebug { Off, Warn, Error };
const char* toString(SyncDebug s);  // "off" | "warn" | "error"

// While alive, a host synchronization with a CUDA device through PyTorch (item(), a copy to the
// host, a blocking copy from pageable memory, a stream or device synchronize) warns (Warn) or
// throws (Error), as torch.cuda.set_sync_debug_mode; Off lets an expected one pass inside a checked
// scope. Process-wide; the previous mode is restored when destroyed; nothing for a CPU device.
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
