#pragma once
// The Gloo communicator's op queue (internal, comm/gloo only): each op a GlooWork, run in issue
// order on the communicator's one GlooWorker thread (gloo needs the same order on every rank).
// An op that throws breaks the worker: it and every later op finish with a CommError naming the
// first failure (and its cause on other ranks, comm/watchdog); abort() breaks it the same way.
// A caller's wait() is bounded by the op's timeout plus the time the watchdog takes to explain a
// peer's failure, so a peer that never joins ends in a clear error, not a hang.
//
// Tensors: the worker releases an op's tensors (the closure's copies and the kept ones) before it
// marks the op done and without holding a lock: a caller that waits keeps its own references until
// then, so the worker never drops the last one of such a tensor. Dropping the last reference of a
// tensor made in Python frees its PyObject, which takes the GIL; under a lock that would stall
// every thread needing the lock (post(), completed()) behind the thread holding the GIL.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/comm/work.h"

namespace tessera::gloo_worker {

using Clock = std::chrono::steady_clock;
inline double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Thrown by an op whose ranks called different collectives (fingerprint.h): it and every later op
// fail with its message, which goes to no watchdog (every rank of the group sees the same mismatch
// before anything is sent: nothing is in transit, no peer is lost, the process may go on).
struct Mismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Shared state of one op: what its callers wait on.
class GlooWork : public Work {
 public:
  GlooWork(OpInfo info, std::chrono::milliseconds timeout, std::vector<at::Tensor> keep)
      : Work(std::move(info)), timeout_(timeout), keep_(std::move(keep)), start_(Clock::now()) {}

  // Worker thread only, before finish(); no other thread reads keep_.
  void releaseTensors() { keep_.clear(); }
  void finish(std::string error);
  void wait() override { synchronize(); }
  void synchronize() override;
  bool completed() override;
  Clock::time_point start() const { return start_; }

 private:
  std::chrono::milliseconds timeout_;
  std::vector<at::Tensor> keep_;
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

// Runs a communicator's ops in order on one thread. Shared with the thread, so a communicator
// destroyed while an op is stuck in gloo does not wait for it.
class GlooWorker {
 public:
  GlooWorker() : thread_([this] { run(); }) {}
  ~GlooWorker() = default;

  void post(std::shared_ptr<GlooWork> w, std::function<void()> fn);
  void breakWith(const std::string& reason);
  // Stops the thread: joins it when idle, else leaves it to finish on its own.
  static void stop(const std::shared_ptr<GlooWorker>& self);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<GlooWork>, std::function<void()>>> q_;
  std::string broken_;
  bool stop_ = false, busy_ = false;
  std::shared_ptr<GlooWorker> keepAlive_;
  std::thread thread_;
};

}  // namespace tessera::gloo_worker
