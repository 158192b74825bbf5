// The timed fake communicator's stream (timed_stream.h): ops as NCCL's are ordered — after the
// caller's stream, on a stream of their own, tensors kept until a poller sees them done.
#include "comm/fake/timed_stream.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/fake/timed_kernel.h"
#include "comm/nccl/cuda_glue.h"
#include "tessera/common/error.h"

namespace tessera::fake_detail {
namespace {

using nccl_detail::DeviceGuard;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(fmt::format("fake communicator: {} failed: {}", what, cudaGetErrorString(e)));
}

class TimedWork : public Work {
 public:
  TimedWork(OpInfo i, int device, cudaEvent_t done, std::vector<at::Tensor> keep)
      : Work(std::move(i)), device_(device), done_(done), keep_(std::move(keep)) {}
  ~TimedWork() override {
    DeviceGuard g(device_);
    cudaEventDestroy(done_);
  }
  void wait() override {
    DeviceGuard g(device_);
    check(cudaStreamWaitEvent(nccl_detail::callerStream(device_), done_, 0), "stream wait");
  }
  void synchronize() override {
    DeviceGuard g(device_);
    check(cudaEventSynchronize(done_), "event synchronize");
    poll();
  }
  bool completed() override { return poll(); }

  // True once done; drops the kept tensors then (outside the lock).
  bool poll() {
    std::vector<at::Tensor> drop;
    std::lock_guard<std::mutex> l(mu_);
    if (finished_) return true;
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return false;
    (void)cudaGetLastError();
    finished_ = true;
    if (e == cudaErrorCudartUnloading) {
      new std::vector<at::Tensor>(std::move(keep_));  // the allocator may be gone: leak, as NCCL's ops do
    } else {
      drop.swap(keep_);
    }
    return true;
  }

 private:
  int device_;
  cudaEvent_t done_;
  std::mutex mu_;
  std::vector<at::Tensor> keep_;
  bool finished_ = false;
};

class CudaTimedStream : public TimedStream {
 public:
  CudaTimedStream(int device, int ctas, bool traffic) : device_(device), ctas_(ctas) {
    DeviceGuard g(device_);
    if (traffic) check(cudaMalloc(&scratch_, 2 * kScratchBytes), "scratch allocation");
    int lo = 0, hi = 0;
    check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "stream priority range");
    check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi), "stream create");
    check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event create");
    poller_ = std::thread([this] { pollLoop(); });
  }
  ~CudaTimedStream() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    poller_.join();
    DeviceGuard g(device_);
    cudaStreamSynchronize(stream_);
    for (auto& w : inflight_) w->poll();
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
  }

  WorkPtr run(const OpInfo& i, double seconds, const std::vector<Copy>& copies, std::vector<at::Tensor> keep) override {
    std::lock_guard<std::mutex> opLock(opMu_);
    DeviceGuard g(device_);
    check(cudaEventRecord(ready_, nccl_detail::callerStream(device_)), "event record");
    check(cudaStreamWaitEvent(stream_, ready_, 0), "stream wait");
    check(launchSpin(stream_, static_cast<unsigned long long>(seconds * 1e9), ctas_, device_, scratch_, kScratchBytes),
          "spin kernel");
    for (const auto& c : copies) {
      if (c.bytes > 0 && c.dst != c.src)
        check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
    }
    cudaEvent_t done = nullptr;
    check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event create");
    const cudaError_t e = cudaEventRecord(done, stream_);
    if (e != cudaSuccess) cudaEventDestroy(done);
    check(e, "event record");
    auto w = std::make_shared<TimedWork>(i, device_, done, std::move(keep));
    {
      std::lock_guard<std::mutex> l(mu_);
      inflight_.push_back(w);
    }
    cv_.notify_all();
    return w;
  }

 private:
  // As NCCL's watchdog: every millisecond while ops are in flight, drop the finished ones.
  void pollLoop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, inflight_.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1));
      while (!inflight_.empty()) {
        auto w = inflight_.front();
        l.unlock();
        DeviceGuard g(device_);
        const bool done = w->poll();
        l.lock();
        if (!done) break;
        if (!inflight_.empty() && inflight_.front() == w) inflight_.pop_front();
      }
    }
  }

  static constexpr size_t kScratchBytes = size_t{64} << 20;
  int device_, ctas_;
  void* scratch_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::mutex opMu_, mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TimedWork>> inflight_;
  bool stop_ = false;
  std::thread poller_;
};

}  // namespace

std::shared_ptr<TimedStream> makeTimedStream(int device, int ctas, bool traffic) {
  return std::make_shared<CudaTimedStream>(device, ctas, traffic);
}

}  // namespace tessera::fake_detail
