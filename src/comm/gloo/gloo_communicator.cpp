#include "comm/gloo/gloo_communicator.h"

#include <ATen/ATen.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/backends.h"
#include "comm/gloo/gloo_ops.h"
#include "comm/watchdog/board.h"
#include "comm/watchdog/watchdog.h"
#include "common/host.h"
#include "common/error.h"
#include "common/log.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// Op tags come from sequence numbers counting up from 0; the construction barrier uses the top one.
constexpr uint32_t kConnectBarrierTag = 0xFFFFFFFFu;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// gloo's rendezvous store interface over a c10d store.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(StorePtr s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = s_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { s_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    s_->wait(keys, timeout);
  }

 private:
  StorePtr s_;
};

// One TCP device per process, bound as setGlooDevice() said (before the first communicator):
// an interface name, else a host name or address, else this host's name, else the loopback.
struct DeviceChoice {
  std::mutex mu;
  std::string ifname, host;
};
DeviceChoice& deviceChoice() {
  static auto* c = new DeviceChoice();
  return *c;
}

std::shared_ptr<gloo::transport::Device> glooDevice() {
  static std::once_flag once;
  static std::shared_ptr<gloo::transport::Device> dev;
  std::call_once(once, [] {
    std::string ifname, host;
    {
      auto& c = deviceChoice();
      std::lock_guard<std::mutex> l(c.mu);
      ifname = c.ifname;
      host = c.host;
    }
    gloo::transport::tcp::attr attr;
    if (!ifname.empty()) {
      attr.iface = ifname;
      dev = gloo::transport::tcp::CreateDevice(attr);
      return;
    }
    if (!host.empty()) {
      attr.hostname = host;
      dev = gloo::transport::tcp::CreateDevice(attr);
      return;
    }
    std::string name = hostName();
    try {
      attr.hostname = name;
      dev = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      log::debug("gloo: cannot bind to host name '{}' ({}); using 127.0.0.1", name, e.what());
      attr.hostname = "127.0.0.1";
      dev = gloo::transport::tcp::CreateDevice(attr);
    }
  });
  return dev;
}

}  // namespace

// Shared state of one op. (Outside the anonymous namespace: GlooWorker, declared in the header,
// holds these in its queue.)
//
// The worker releases an op's tensors (the closure's copies and keep_) before it marks the op
// done and without holding a lock: a caller that waits keeps its own references until then, so
// the worker never drops the last one of such a tensor. Dropping the last reference of a tensor
// made in Python frees its PyObject, which takes the GIL; under a lock that would stall every
// thread needing the lock (post(), completed()) behind the thread holding the GIL.
class GlooWork : public Work {
 public:
  GlooWork(OpInfo info, std::chrono::milliseconds timeout, std::vector<at::Tensor> keep)
      : Work(std::move(info)), timeout_(timeout), keep_(std::move(keep)), start_(Clock::now()) {}

  // Worker thread only, before finish(); no other thread reads keep_.
  void releaseTensors() { keep_.clear(); }
  void finish(std::string error) {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    error_ = std::move(error);
    cv_.notify_all();
  }
  void wait() override { synchronize(); }
  void synchronize() override {
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
  bool completed() override {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
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

// Runs a communicator's ops in order on one thread. Shared with the thread, so a
// communicator destroyed while an op is stuck in gloo does not wait for it.
class GlooWorker {
 public:
  GlooWorker() : thread_([this] { run(); }) {}
  ~GlooWorker() = default;

  void post(std::shared_ptr<GlooWork> w, std::function<void()> fn) {
    std::lock_guard<std::mutex> l(mu_);
    q_.emplace_back(std::move(w), std::move(fn));
    cv_.notify_one();
  }
  void breakWith(const std::string& reason) {
    std::lock_guard<std::mutex> l(mu_);
    if (broken_.empty()) broken_ = reason;
  }
  // Stops the thread: joins it when idle, else leaves it to finish on its own.
  static void stop(const std::shared_ptr<GlooWorker>& self) {
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

 private:
  void run() {
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
        } catch (const std::exception& e) {
          err = watchdog::withCause(fmt::format("tessera: {} failed after {:.1f} s: {}", w->info().describe(),
                                                secondsSince(w->start()), e.what()));
          breakWith(err);
          watchdog::onCommFailure(err, nullptr);
        }
      }
      fn = nullptr;  // the op's tensors go before it is marked done, outside the lock (see GlooWork)
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

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<GlooWork>, std::function<void()>>> q_;
  std::string broken_;
  bool stop_ = false, busy_ = false;
  std::shared_ptr<GlooWorker> keepAlive_;
  std::thread thread_;
};

GlooCommunicator::GlooCommunicator(const StorePtr& store, int rank, int size, const std::string& name,
                                   std::chrono::milliseconds timeout)
    : Communicator(rank, size, name), store_(store), sendCount_(size, 0), recvCount_(size, 0) {
  setTimeout(timeout);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  GlooStore gs(prefixStore("gloo/" + name, store));
  auto t0 = Clock::now();
  try {
    auto dev = glooDevice();
    ctx->connectFullMesh(gs, dev);
    // A rank's side of the mesh can be complete while a peer is still in its handshake; if this rank then
    // failed and exited (say, on a bad argument right after set-up) the peer would see "connection closed"
    // instead of its own clear error. One barrier makes construction return only once every pair is up.
    gloo_ops::barrier(ctx, timeout, kConnectBarrierTag);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("tessera: gloo communicator '{}' (rank {} of {}) could not connect after {:.1f} s: {}",
                                name, rank, size, secondsSince(t0), e.what()));
  }
  ctx_ = ctx;
  worker_ = std::make_shared<GlooWorker>();
  setSideChannel(store, "gloo/" + name);
}

GlooCommunicator::~GlooCommunicator() { GlooWorker::stop(worker_); }

void GlooCommunicator::abort(const std::string& reason) { worker_->breakWith("aborted: " + reason); }

void GlooCommunicator::checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const {
  TESSERA_CHECK(t.device().is_cpu(), "{}: {} tensor is on {}, the gloo communicator takes CPU tensors", i.describe(),
                what, t.device().str());
}

at::TensorOptions GlooCommunicator::scratchOptions() const { return at::TensorOptions().device(at::kCPU); }

namespace {
template <typename F>
WorkPtr submit(GlooWorker& worker, const OpInfo& i, std::chrono::milliseconds timeout, std::vector<at::Tensor> keep,
               F&& fn) {
  auto w = std::make_shared<GlooWork>(i, timeout, std::move(keep));
  worker.post(w, std::forward<F>(fn));
  return w;
}
}  // namespace

WorkPtr GlooCommunicator::doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {t}, [c = ctx_, to = timeout_, tag, t, op] {
    gloo_ops::allReduce(c, to, tag, t, op);
  });
}

WorkPtr GlooCommunicator::doBroadcast(const OpInfo& i, const at::Tensor& t, int root) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {t}, [c = ctx_, to = timeout_, tag, t, root] {
    gloo_ops::broadcast(c, to, tag, t, root);
  });
}

WorkPtr GlooCommunicator::doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {t}, [c = ctx_, to = timeout_, tag, t, root, op] {
    gloo_ops::reduce(c, to, tag, t, root, op);
  });
}

WorkPtr GlooCommunicator::doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {out, in}, [c = ctx_, to = timeout_, tag, out, in] {
    gloo_ops::allGather(c, to, tag, out, in);
  });
}

WorkPtr GlooCommunicator::doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in,
                                          ReduceOp op) {
  // Gloo has no reduce-scatter with this layout: all-reduce a copy, keep this rank's chunk.
  auto tag = static_cast<uint32_t>(i.seq);
  int r = rank_, n = size_;
  return submit(*worker_, i, timeout_, {out, in}, [c = ctx_, to = timeout_, tag, out, in, op, r, n] {
    auto tmp = in.reshape({-1}).clone();
    gloo_ops::allReduce(c, to, tag, tmp, op);
    out.reshape({-1}).copy_(tmp.chunk(n)[r]);
  });
}

WorkPtr GlooCommunicator::doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {out, in}, [c = ctx_, to = timeout_, tag, out, in] {
    gloo_ops::allToAll(c, to, tag, out, in);
  });
}

WorkPtr GlooCommunicator::doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) {
  // Slots pair the k-th send a→b with the k-th recv b←a; the high bit keeps them apart from
  // the slots gloo's collectives use.
  std::vector<uint64_t> slots;
  std::vector<at::Tensor> keep;
  for (const auto& o : ops) {
    auto& count = o.kind == P2POp::Send ? sendCount_[o.peer] : recvCount_[o.peer];
    slots.push_back((1ull << 62) | count++);
    keep.push_back(o.tensor);
  }
  return submit(*worker_, i, timeout_, std::move(keep), [c = ctx_, to = timeout_, ops, slots] {
    gloo_ops::batchP2P(c, to, ops, slots);
  });
}

WorkPtr GlooCommunicator::doBarrier(const OpInfo& i) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(*worker_, i, timeout_, {}, [c = ctx_, to = timeout_, tag] { gloo_ops::barrier(c, to, tag); });
}

std::shared_ptr<Communicator> GlooCommunicator::doSplit(int, const std::vector<int>& members, const std::string& name,
                                                        const std::string& tag) {
  if (members.empty()) return nullptr;
  int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  return std::make_shared<GlooCommunicator>(prefixStore(tag, store_), newRank, static_cast<int>(members.size()), name,
                                            timeout_);
}

bool glooAvailable() { return true; }

void setGlooDevice(const std::string& ifname, const std::string& host) {
  auto& c = deviceChoice();
  std::lock_guard<std::mutex> l(c.mu);
  c.ifname = ifname;
  c.host = host;
}

CommPtr makeGlooCommunicator(const StorePtr& store, int rank, int size, const std::string& name,
                             std::chrono::milliseconds timeout) {
  auto c = std::make_shared<GlooCommunicator>(store, rank, size, name, timeout);
  watchdog::track(c);
  return c;
}

}  // namespace tessera
