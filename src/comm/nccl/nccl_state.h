#pragma once
// Shared state of one NcclCommunicator and the Work handles of its ops. Internal header.
//
// Threads: callers issue ops (serialised by opMu); one watchdog thread per communicator polls
// the completion events of in-flight ops (dropping their tensor references as they finish),
// checks each op's age against its timeout and polls ncclCommGetAsyncError. On a timeout,
// an async error or abort(), fail() marks the communicator broken and every unfinished op
// failed; the watchdog thread then calls ncclCommAbort (the only thread that does), which
// makes NCCL's kernels return. Works keep the state alive (shared_ptr), so they may outlive
// their communicator.
#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessera/comm/work.h"

namespace tessera::nccl_detail {

using Clock = std::chrono::steady_clock;
class NcclWork;

struct NcclState {
  NcclState(int rank, int size, int device, std::string name);
  ~NcclState();  // destroys the stream and events (the comm is finalised by shutdown())

  int rank, size, device;
  std::string name;
  ncclComm_t comm = nullptr;       // every op runs on this one (blocking by default)
  ncclComm_t control = nullptr;    // non-blocking twin used to bound init/splits (or nullptr)
  cudaStream_t stream = nullptr;  // the communicator's own stream (greatest priority unless start() said not)
  cudaEvent_t ready = nullptr;    // reused: "caller's stream reached this op"
  void* scratch = nullptr;        // 4 bytes of device memory for barrier()
  // Fingerprint check (comm/watchdog/fingerprint.h): each op's gathered fingerprints, on the
  // device (size x 4 words, reused op after op on the stream), and the first mismatch the device
  // found, host-mapped: [0] the op's seq (0: none yet), then its gathered words.
  int64_t* fpGathered = nullptr;
  int64_t* fpHost = nullptr;  // pinned host memory; fpHostOnDevice is its device address
  int64_t* fpHostOnDevice = nullptr;
  std::timed_mutex opMu;          // serialises NCCL calls on `comm`

  // Creates the stream (of the device's greatest priority, else the default one), events and
  // scratch buffer and starts the watchdog. `comm` is set.
  void start(bool highPriorityStream = true);
  // Waits (bounded by the ops' own timeouts) for in-flight ops, stops the watchdog, then
  // finalises and destroys the comm (or aborts it when that does not finish in time).
  void shutdown();

  cudaEvent_t takeEvent();
  void giveEvent(cudaEvent_t e);
  void track(const std::shared_ptr<NcclWork>& w);
  // "" while healthy; else why the communicator is broken.
  std::string broken();
  // The seq of the first collective whose ranks' fingerprints differed (0: none yet), and the
  // error for op `i` (that collective) naming every rank's call. Any thread.
  int64_t mismatchSeq() const;
  std::string mismatchMessage(const OpInfo& i) const;
  // Marks the communicator broken (first reason wins) and all unfinished ops failed; asks the
  // watchdog to abort the NCCL communicator. Idempotent, any thread.
  void fail(const std::string& reason);
  // Polls ncclCommGetAsyncError(c) until it is not ncclInProgress; on an error or after
  // `timeout`, throws CommError naming `what` (the caller decides what to abort).
  void waitNotInProgress(ncclComm_t c, const std::string& what, std::chrono::milliseconds timeout);

 private:
  void watchdogLoop();
  void abortComm();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> inflight_;
  std::vector<cudaEvent_t> pool_;
  std::string broken_;
  bool abortRequested_ = false, aborted_ = false, stop_ = false;
  std::thread watchdog_;
};

class NcclWork : public Work {
 public:
  NcclWork(OpInfo info, std::shared_ptr<NcclState> st, cudaEvent_t done, std::vector<at::Tensor> keep,
           std::chrono::milliseconds timeout);
  ~NcclWork() override;

  // Caller's current stream waits on the completion event; no host synchronisation.
  void wait() override;
  // Blocks until the op completed; throws CommError when it failed or timed out.
  void synchronize() override;
  bool completed() override;

  // Watchdog side. 1: finished (tensors released), 0: running, -1: CUDA error (in `err`),
  // kMismatch: finished, but its ranks called different collectives (the error in `err`; the
  // caller fails the communicator).
  static constexpr int kMismatch = -2;
  int poll(std::string& err);
  // Marks the op failed unless it already finished; returns true when it was marked.
  bool markFailed(const std::string& why);
  Clock::time_point start() const { return start_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void throwIfFailed();

  std::shared_ptr<NcclState> st_;
  cudaEvent_t done_;
  std::chrono::milliseconds timeout_;
  Clock::time_point start_;
  std::mutex mu_;
  std::vector<at::Tensor> keep_;
  bool finished_ = false;
  std::string error_;
};

double secondsSince(Clock::time_point t0);

}  // namespace tessera::nccl_detail
