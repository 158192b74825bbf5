#pragma once
// GlooCommunicator: CPU tensors over Debian's libgloo (TCP transport). Internal header: the
// public entry point is makeGlooCommunicator() in comm/backends.h.
//
// Each communicator owns one gloo context (full mesh of TCP pairs) and one worker thread;
// ops run on that thread in issue order (gloo requires the same order on every rank), so
// every op is asynchronous for the caller. An op that fails (peer closed the connection,
// gloo timeout) breaks the communicator: that op and every later one throw CommError.
// With fingerprints on, each collective starts with its preamble round (gloo_ops.h): a mismatch
// fails it on every rank before any tensor changes; a small one is computed from the preamble.
#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/comm/store.h"

namespace gloo {
class Context;
}

namespace tessera {

namespace gloo_worker {
class GlooWorker;
}
namespace gloo_ops {
class Preamble;
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const StorePtr& store, int rank, int size, const std::string& name,
                   std::chrono::milliseconds timeout);
  ~GlooCommunicator() override;

  Backend backend() const override { return Backend::Gloo; }
  void abort(const std::string& reason) override;

 protected:
  WorkPtr doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) override;
  WorkPtr doBroadcast(const OpInfo& i, const at::Tensor& t, int root) override;
  WorkPtr doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) override;
  WorkPtr doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override;
  WorkPtr doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp op) override;
  WorkPtr doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override;
  WorkPtr doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) override;
  WorkPtr doBarrier(const OpInfo& i) override;
  std::shared_ptr<Communicator> doSplit(int color, const std::vector<int>& members, const std::string& name,
                                        const std::string& tag) override;
  void checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const override;
  at::TensorOptions scratchOptions() const override;

 private:
  StorePtr store_;
  std::shared_ptr<gloo::Context> ctx_;
  std::shared_ptr<gloo_worker::GlooWorker> worker_;  // gloo_worker.h: the op queue's thread
  std::shared_ptr<gloo_ops::Preamble> pre_;  // each collective's first round (gloo_ops.h; worker thread only)
  std::vector<uint64_t> sendCount_, recvCount_;  // per peer, to pair p2p ops by order
};

}  // namespace tessera
