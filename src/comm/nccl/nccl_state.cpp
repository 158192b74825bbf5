#include "comm/nccl/nccl_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "comm/nccl/cuda_glue.h"
#include "comm/nccl/nccl_check.h"
#include "comm/watchdog/fingerprint.h"
#include "comm/watchdog/watchdog.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera::nccl_detail {

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---------------------------------------------------------------------------------------------
// NcclState

NcclState::NcclState(int rank_, int size_, int device_, std::string name_)
    : rank(rank_), size(size_), device(device_), name(std::move(name_)) {}

NcclState::~NcclState() {
  DeviceGuard g(device);
  for (auto e : pool_) cudaEventDestroy(e);
  if (ready) cudaEventDestroy(ready);
  if (stream) cudaStreamDestroy(stream);
  if (scratch) cudaFree(scratch);
  if (fpGathered) cudaFree(fpGathered);
  if (fpHost) cudaFreeHost(fpHost);
  (void)cudaGetLastError();
}

void NcclState::start(bool highPriorityStream) {
  DeviceGuard g(device);
  int least = 0, greatest = 0;
  TESSERA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), rank);
  // `least` is the default priority (0), that of LibTorch's default and pool streams.
  TESSERA_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, highPriorityStream ? greatest : least),
                     rank);
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), rank);
  TESSERA_CUDA_CHECK(cudaMalloc(&scratch, 16), rank);
  TESSERA_CUDA_CHECK(cudaMemset(scratch, 0, 16), rank);
  const size_t words = static_cast<size_t>(fingerprint::kWords) * size;
  TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&fpGathered), words * sizeof(int64_t)), rank);
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&fpHost), (1 + words) * sizeof(int64_t), cudaHostAllocMapped),
                     rank);
  std::fill(fpHost, fpHost + 1 + words, 0);
  TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&fpHostOnDevice), fpHost, 0), rank);
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

cudaEvent_t NcclState::takeEvent() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!pool_.empty()) {
      auto e = pool_.back();
      pool_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank);
  return e;
}

void NcclState::giveEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(mu_);
  pool_.push_back(e);
}

void NcclState::track(const std::shared_ptr<NcclWork>& w) {
  std::lock_guard<std::mutex> l(mu_);
  bool wake = inflight_.empty();
  inflight_.push_back(w);
  if (wake) cv_.notify_all();
}

std::string NcclState::broken() {
  std::lock_guard<std::mutex> l(mu_);
  return broken_;
}

int64_t NcclState::mismatchSeq() const {
  const int64_t seq = fpHost ? *reinterpret_cast<volatile const int64_t*>(fpHost) : 0;
  std::atomic_thread_fence(std::memory_order_acquire);  // the words were written before the seq
  return seq;
}

std::string NcclState::mismatchMessage(const OpInfo& i) const {
  std::vector<int64_t> all(static_cast<size_t>(fingerprint::kWords) * size);
  for (size_t k = 0; k < all.size(); ++k) all[k] = reinterpret_cast<volatile const int64_t*>(fpHost)[1 + k];
  auto diff = fingerprint::compare(i, all.data());
  return fmt::format("tessera: {}: {}. Every rank of a group must call the same collectives in the same order, with "
                     "the same element count, dtype, reduction and root. NCCL communicator '{}' is aborted: this op's "
                     "output is undefined and later ops on it fail",
                     i.describe(), diff.empty() ? "the ranks called different collectives" : diff, name);
}

void NcclState::fail(const std::string& reason) {
  std::vector<std::shared_ptr<NcclWork>> works;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.empty()) return;
    broken_ = reason;
    works.assign(inflight_.begin(), inflight_.end());
    abortRequested_ = true;
  }
  log::error("{}", reason);
  for (auto& w : works) {
    // The op the reason names gets the reason itself; the others say why they could not finish.
    bool culprit = reason.find(w->info().describe()) != std::string::npos;
    w->markFailed(culprit ? reason
                          : fmt::format("tessera: {} did not complete: communicator '{}' was aborted: {}",
                                        w->info().describe(), name, reason));
  }
  std::lock_guard<std::mutex> l(mu_);
  cv_.notify_all();
}

void NcclState::waitNotInProgress(ncclComm_t c, const std::string& what, std::chrono::milliseconds timeout) {
  // A non-blocking communicator launches every op from a helper thread of NCCL's and reports
  // ncclInProgress until it is done (tens of microseconds): spin first, then sleep.
  auto t0 = Clock::now();
  auto spinUntil = t0 + std::chrono::milliseconds(10);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    TESSERA_NCCL_CHECK(ncclCommGetAsyncError(c, &state), rank, c);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const char* last = ncclGetLastError(c);
      throw CommError(fmt::format("tessera: {} on communicator '{}' (rank {} of {}) failed after {:.1f} s: {}{}{}",
                                  what, name, rank, size, secondsSince(t0), ncclGetErrorString(state),
                                  (last && *last) ? ": " : "", last ? last : ""));
    }
    if (Clock::now() - t0 > timeout) {
      throw CommError(fmt::format(
          "tessera: {} on communicator '{}' (rank {} of {}) timed out after {:.1f} s (timeout {:.1f} s)", what, name,
          rank, size, secondsSince(t0), timeout.count() / 1000.0));
    }
    if (Clock::now() < spinUntil) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclState::abortComm() {
  // Callers hold opMu only briefly; should one be stuck inside NCCL, abort anyway.
  bool locked = opMu.try_lock_for(std::chrono::seconds(2));
  ncclComm_t c = comm, k = control;
  comm = nullptr;
  control = nullptr;
  DeviceGuard g(device);
  if (c) ncclCommAbort(c);
  if (k) ncclCommAbort(k);
  if (locked) opMu.unlock();
  std::deque<std::shared_ptr<NcclWork>> drop;  // NCCL's kernels are gone: release the tensors
  {
    std::lock_guard<std::mutex> l(mu_);
    aborted_ = true;
    drop.swap(inflight_);
    cv_.notify_all();
  }
}

void NcclState::watchdogLoop() {
  cudaSetDevice(device);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (abortRequested_ && !aborted_) {
      l.unlock();
      abortComm();
      l.lock();
      continue;
    }
    if (stop_) break;
    cv_.wait_for(l, inflight_.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1));
    if (stop_ || (abortRequested_ && !aborted_) || inflight_.empty() || !broken_.empty()) continue;
    std::vector<std::shared_ptr<NcclWork>> works(inflight_.begin(), inflight_.end());
    ncclComm_t c = comm;
    l.unlock();
    size_t finished = 0;
    std::string failure;
    bool mismatch = false;  // a mismatch (fingerprint.h) is no failure in transit: no cause to look for
    for (auto& w : works) {  // ops finish in issue order (one stream): stop at the first running one
      std::string err;
      int s = w->poll(err);
      if (s == 1) {
        ++finished;
        continue;
      }
      if (s < 0) {
        failure = err;
        mismatch = s == NcclWork::kMismatch;
      } else if (mismatchSeq() == static_cast<int64_t>(w->info().seq) && w->info().fingerprint[0] != 0) {
        // The op's ranks disagreed; it may be stuck on the mismatched sizes.
        failure = mismatchMessage(w->info());
        mismatch = true;
      } else if (Clock::now() - w->start() > w->timeout()) {
        failure = fmt::format("tessera: {} timed out after {:.1f} s (timeout {:.1f} s) on device cuda:{}; NCCL "
                              "communicator '{}' aborted",
                              w->info().describe(), secondsSince(w->start()), w->timeout().count() / 1000.0, device,
                              name);
      } else if (c) {
        ncclResult_t ar = ncclSuccess;
        if (ncclCommGetAsyncError(c, &ar) == ncclSuccess && ar != ncclSuccess && ar != ncclInProgress) {
          const char* last = ncclGetLastError(c);
          failure = fmt::format("tessera: {} failed after {:.1f} s: NCCL reported an asynchronous error on "
                                "communicator '{}': {}{}{}; communicator aborted",
                                w->info().describe(), secondsSince(w->start()), name, ncclGetErrorString(ar),
                                (last && *last) ? ": " : "", last ? last : "");
        }
      }
      break;
    }
    works.clear();
    std::vector<std::shared_ptr<NcclWork>> done;
    l.lock();
    for (size_t k = 0; k < finished && !inflight_.empty(); ++k) {
      done.push_back(std::move(inflight_.front()));
      inflight_.pop_front();
    }
    if (inflight_.empty()) cv_.notify_all();  // shutdown() waits for this
    l.unlock();
    done.clear();  // may destroy Works, which return their event under mu_
    if (!failure.empty() && mismatch) {
      fail(failure);  // every rank of the group sees it alike: the process goes on (catchable)
    } else if (!failure.empty()) {
      failure = watchdog::withCause(failure);
      fail(failure);
      watchdog::onCommFailure(failure, nullptr);
    }
    l.lock();
  }
}

void NcclState::shutdown() {
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return inflight_.empty() && (!abortRequested_ || aborted_); });
    stop_ = true;
    cv_.notify_all();
  }
  if (watchdog_.joinable()) watchdog_.join();
  DeviceGuard g(device);
  if (control) {
    ncclCommAbort(control);  // never ran an op: nothing to flush, abort just frees it
    control = nullptr;
  }
  if (!comm) return;
  try {
    if (TESSERA_NCCL_CHECK(ncclCommFinalize(comm), rank, comm) == ncclInProgress) {
      waitNotInProgress(comm, "ncclCommFinalize", std::chrono::seconds(30));
    }
    TESSERA_NCCL_CHECK(ncclCommDestroy(comm), rank, comm);
  } catch (const std::exception& e) {
    log::warn("{}; aborting the NCCL communicator instead", e.what());
    ncclCommAbort(comm);
  }
  comm = nullptr;
}

}  // namespace tessera::nccl_detail
