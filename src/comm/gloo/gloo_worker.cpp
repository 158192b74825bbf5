// The Gloo communicator's op queue (contract in gloo_worker.h).
#include "comm/gloo/gloo_worker.h"

#include <fmt/format.h>

#include "comm/watchdog/board.h"
#include "comm/watchdog/watchdog.h"
#include "tessera/common/error.h"

namespace tessera::gloo_worker {

void GlooWork::finish(std::string error) {
  std::lock_guard<std::mutex> l(mu_);
  done_ = true;
  error_ = std::move(error);
  cv_.notify_all();
}

void GlooWork::synchronize() {
  std::unique_lock<std::mutex> l(mu_);
  // The op itself carries the timeout; the margin lets its own error (and its cause) arrive first.
  auto deadline = start_ + timeout_ + board::explainBound();
  if (!cv_.wait_until(l, deadline, [&] { return done_; })) {
    l.unlock();
    throw CommError(
        watchdog::withCause(fmt::format("tessera: {} timed out after {:.1f} s (timeout {:.1f} s): a peer did not "
                                        "take part",
                                        info_.describe(), secondsSince(start_), timeout_.count() / 1000.0)));
  }
  if (!error_.empty()) throw CommError(error_);
}

bool GlooWork::completed() {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

void GlooWorker::post(std::shared_ptr<GlooWork> w, std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  q_.emplace_back(std::move(w), std::move(fn));
  cv_.notify_one();
}

void GlooWorker::breakWith(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  if (broken_.empty()) broken_ = reason;
}

void GlooWorker::stop(const std::shared_ptr<GlooWorker>& self) {
  std::unique_lock<std::mutex> l(self->mu_);
  self->stop_ = true;
  self->cv_.notify_one();
  bool busy = self->busy_;
  l.unlock();
  if (busy) {
    self->keepAlive_ = self;  // the thread releases it when it exits
    self->thread_.detach();
  } else {
    self->thread_.join();
  }
}

void GlooWorker::run() {
  for (;;) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) break;
    auto [w, fn] = std::move(q_.front());
    q_.pop_front();
    std::string broken = broken_;
    busy_ = true;
    l.unlock();
    std::string err;
    if (!broken.empty()) {
      err = fmt::format("tessera: {} not run: the communicator is broken by an earlier failure: {}",
                        w->info().describe(), broken);
    } else {
      try {
        fn();
      } catch (const Mismatch& e) {
        err = e.what();
        breakWith(err);
      } catch (const std::exception& e) {
        err = watchdog::withCause(fmt::format("tessera: {} failed after {:.1f} s: {}", w->info().describe(),
                                              secondsSince(w->start()), e.what()));
        breakWith(err);
        watchdog::onCommFailure(err, nullptr);
      }
    }
    fn = nullptr;  // the op's tensors go before it is marked done, outside the lock (gloo_worker.h)
    w->releaseTensors();
    w->finish(std::move(err));
    w.reset();
    l.lock();
    busy_ = false;
  }
  std::shared_ptr<GlooWorker> self;
  {
    std::lock_guard<std::mutex> l(mu_);
    self = std::move(keepAlive_);
  }
}

}  // namespace tessera::gloo_worker
