// NcclWork: the handle of one op on an NcclCommunicator (see nccl_state.h).
#include <fmt/format.h>

#include <thread>

#include "comm/nccl/cuda_glue.h"
#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_state.h"
#include "comm/watchdog/board.h"
#include "comm/watchdog/watchdog.h"
#include "tessera/common/error.h"

namespace tessera::nccl_detail {


NcclWork::NcclWork(OpInfo info, std::shared_ptr<NcclState> st, cudaEvent_t done, std::vector<at::Tensor> keep,
                   std::chrono::milliseconds timeout)
    : Work(std::move(info)), st_(std::move(st)), done_(done), timeout_(timeout), start_(Clock::now()),
      keep_(std::move(keep)) {}

NcclWork::~NcclWork() { st_->giveEvent(done_); }

void NcclWork::throwIfFailed() {
  std::lock_guard<std::mutex> l(mu_);
  if (!error_.empty()) throw CommError(error_);
}

void NcclWork::wait() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!error_.empty()) throw CommError(error_);
    if (finished_) return;
  }
  DeviceGuard g(st_->device);
  TESSERA_CUDA_CHECK(cudaStreamWaitEvent(callerStream(st_->device), done_, 0), st_->rank);
}

int NcclWork::poll(std::string& err) {
  std::vector<at::Tensor> drop;  // released outside the lock
  std::lock_guard<std::mutex> l(mu_);
  if (finished_) return 1;
  cudaError_t e = cudaEventQuery(done_);
  if (e == cudaSuccess) {
    finished_ = true;
    drop.swap(keep_);
    // Done on the device, so its fingerprint comparison ran before it (same stream).
    if (info_.fingerprint[0] != 0 && st_->mismatchSeq() == static_cast<int64_t>(info_.seq)) {
      error_ = err = st_->mismatchMessage(info_);
      return kMismatch;
    }
    return 1;
  }
  if (e == cudaErrorNotReady) return 0;
  (void)cudaGetLastError();
  if (e == cudaErrorCudartUnloading) {
    // The process is exiting and the CUDA runtime is going away under the (detached) watchdog:
    // no communication failed, so none is reported. The kept tensors are leaked on purpose:
    // freeing them would call into a caching allocator that may already be gone.
    finished_ = true;
    new std::vector<at::Tensor>(std::move(keep_));
    return 1;
  }
  err = fmt::format("tessera: {} failed on device cuda:{}: cudaEventQuery returned {} ({})", info_.describe(),
                    st_->device, cudaGetErrorName(e), cudaGetErrorString(e));
  return -1;
}

bool NcclWork::markFailed(const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (finished_) return false;
  if (error_.empty() && cudaEventQuery(done_) == cudaSuccess) {  // finished before the failure
    finished_ = true;
    return false;
  }
  if (error_.empty()) error_ = why;
  return true;
}

void NcclWork::synchronize() {
  DeviceGuard g(st_->device);
  auto spinUntil = Clock::now() + std::chrono::milliseconds(2);
  for (;;) {
    std::string err;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!error_.empty()) throw CommError(error_);
      if (finished_) return;
    }
    int s = poll(err);
    if (s == 1) {
      throwIfFailed();  // an abort (after marking this op failed) also completes the event
      return;
    }
    if (s < 0) {
      if (s != kMismatch) err = watchdog::withCause(err);
      st_->fail(err);
      throw CommError(err);
    }
    // The watchdog fails timed-out ops; this is the backstop should it be stuck.
    if (Clock::now() - start_ > timeout_ + std::chrono::seconds(5) + board::explainBound()) {
      auto msg = fmt::format("tessera: {} timed out after {:.1f} s (timeout {:.1f} s) on device cuda:{}",
                             info_.describe(), secondsSince(start_), timeout_.count() / 1000.0, st_->device);
      st_->fail(msg);
      throw CommError(msg);
    }
    if (Clock::now() < spinUntil) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

bool NcclWork::completed() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (finished_ || !error_.empty()) return true;
  }
  std::string err;
  const int s = poll(err);
  if (s == kMismatch) st_->fail(err);
  return s != 0;
}

}  // namespace tessera::nccl_detail
