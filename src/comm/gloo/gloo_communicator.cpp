#include "comm/gloo/gloo_communicator.h"

#include <ATen/ATen.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <functional>
#include <mutex>

#include "tessera/comm/backends.h"
#include "comm/gloo/gloo_ops.h"
#include "comm/gloo/gloo_worker.h"
#include "comm/watchdog/board.h"
#include "comm/watchdog/fingerprint.h"
#include "comm/watchdog/watchdog.h"
#include "common/host.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera {

using gloo_worker::Clock;
using gloo_worker::GlooWork;
using gloo_worker::GlooWorker;
using gloo_worker::secondsSince;

namespace {

// Op tags come from sequence numbers counting up from 0; the construction barrier uses the top one.
constexpr uint32_t kConnectBarrierTag = 0xFFFFFFFFu;
// The preamble of op `seq` (gloo_ops.h) uses slot kFingerprintSlot | seq: apart
// from the collectives' (gloo's prefix << 56 | tag) and point-to-point ops' (1 << 62 | count).
constexpr uint64_t kFingerprintSlot = 1ull << 61;

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
  pre_ = std::make_shared<gloo_ops::Preamble>(ctx_, kFingerprintSlot);
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
using Ms = std::chrono::milliseconds;
void noInline(const gloo_ops::Preamble&) {}

// Posts op `i`; `fn()` runs it through gloo. With a fingerprint (fingerprint.h) the preamble's round
// comes first, on the worker thread: every rank's fingerprint and, when small, `in` (the op's input)
// reach every rank; a mismatch throws before any tensor is touched, and when every rank's input came
// along, `inl(preamble)` computes the op instead of `fn`.
template <typename Inline, typename F>
WorkPtr submit(GlooWorker& worker, const std::shared_ptr<gloo_ops::Preamble>& pre, const OpInfo& i, Ms timeout,
               std::vector<at::Tensor> keep, at::Tensor in, Inline&& inl, F&& fn) {
  auto w = std::make_shared<GlooWork>(i, timeout, std::move(keep));
  if (i.fingerprint[0] == 0) {
    worker.post(w, std::forward<F>(fn));
    return w;
  }
  worker.post(w, [pre, timeout, i, in, inl = std::forward<Inline>(inl), fn = std::forward<F>(fn)] {
    const auto* all = pre->run(i.seq, i.fingerprint.data(), in.defined() ? in.data_ptr() : nullptr,
                               in.defined() ? in.nbytes() : 0, timeout);
    const auto diff = fingerprint::compare(i, all);
    if (!diff.empty()) {
      throw gloo_worker::Mismatch(fmt::format("tessera: {}: {}. Every rank of a group must call the same collectives "
                                              "in the same order, with the same element count, dtype, reduction and "
                                              "root. The op was not run (no tensor changed); the communicator is "
                                              "broken: later ops on it fail",
                                              i.describe(), diff));
    }
    if (pre->allInline()) {
      inl(*pre);
    } else {
      fn();
    }
  });
  return w;
}
}  // namespace

WorkPtr GlooCommunicator::doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(
      *worker_, pre_, i, timeout_, {t}, t, [t, op](const auto& p) { gloo_ops::inlineAllReduce(p, t, op); },
      [c = ctx_, to = timeout_, tag, t, op] { gloo_ops::allReduce(c, to, tag, t, op); });
}

WorkPtr GlooCommunicator::doBroadcast(const OpInfo& i, const at::Tensor& t, int root) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(
      *worker_, pre_, i, timeout_, {t}, t, [t, root](const auto& p) { gloo_ops::inlineBroadcast(p, t, root); },
      [c = ctx_, to = timeout_, tag, t, root] { gloo_ops::broadcast(c, to, tag, t, root); });
}

WorkPtr GlooCommunicator::doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(
      *worker_, pre_, i, timeout_, {t}, t, [t, root, op](const auto& p) { gloo_ops::inlineReduce(p, t, root, op); },
      [c = ctx_, to = timeout_, tag, t, root, op] { gloo_ops::reduce(c, to, tag, t, root, op); });
}

WorkPtr GlooCommunicator::doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(
      *worker_, pre_, i, timeout_, {out, in}, in, [out](const auto& p) { gloo_ops::inlineAllGather(p, out); },
      [c = ctx_, to = timeout_, tag, out, in] { gloo_ops::allGather(c, to, tag, out, in); });
}

WorkPtr GlooCommunicator::doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in,
                                          ReduceOp op) {
  // Gloo has no reduce-scatter with this layout: all-reduce a copy, keep this rank's chunk.
  auto tag = static_cast<uint32_t>(i.seq);
  int r = rank_, n = size_;
  return submit(
      *worker_, pre_, i, timeout_, {out, in}, in,
      [out, op](const auto& p) { gloo_ops::inlineReduceScatter(p, out, op); },
      [c = ctx_, to = timeout_, tag, out, in, op, r, n] {
        auto tmp = in.reshape({-1}).clone();
        gloo_ops::allReduce(c, to, tag, tmp, op);
        out.reshape({-1}).copy_(tmp.chunk(n)[r]);
      });
}

WorkPtr GlooCommunicator::doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  auto tag = static_cast<uint32_t>(i.seq);
  return submit(
      *worker_, pre_, i, timeout_, {out, in}, in, [out](const auto& p) { gloo_ops::inlineAllToAll(p, out); },
      [c = ctx_, to = timeout_, tag, out, in] { gloo_ops::allToAll(c, to, tag, out, in); });
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
  return submit(*worker_, pre_, i, timeout_, std::move(keep), at::Tensor(), noInline,
                [c = ctx_, to = timeout_, ops, slots] { gloo_ops::batchP2P(c, to, ops, slots); });
}

WorkPtr GlooCommunicator::doBarrier(const OpInfo& i) {
  auto tag = static_cast<uint32_t>(i.seq);
  // Inline: the preamble's round is the barrier (every rank heard from every other).
  return submit(*worker_, pre_, i, timeout_, {}, at::Tensor(), noInline,
                [c = ctx_, to = timeout_, tag] { gloo_ops::barrier(c, to, tag); });
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
