#pragma once
// Communicator: a group of ranks and the collectives between them.
//
// Every op is *collective* over the communicator (all its ranks must call it, in the same
// order, with matching sizes) except send/recv/batchP2P, which involve the named peers only.
// Every op is asynchronous and returns a Work (see work.h). Ops run in issue order.
// Inputs are checked before anything is sent: device (CPU for Gloo, the communicator's CUDA
// device for NCCL), contiguity, dtype (fp32, bf16, fp16, int32, int64; equal across in/out),
// and sizes; a bad input throws tessera::Error naming the op, the group, the rank and the
// value. Each op carries a timeout (the maker's, e.g. Settings::timeout; setTimeout()): when it
// expires the op fails on that rank with the op, the group, its sequence number and the
// elapsed time. After a failure the communicator is broken: later ops throw the first error.
// Every op is recorded in the process's flight recorder (comm/watchdog/flight_recorder.h); a
// failure in transit goes to the process watchdog (comm/watchdog/watchdog.h), which aborts
// the other communicators and ends the process. Every collective is first compared with the other
// ranks' calls (comm/watchdog/fingerprint.h; TESSERA_DEBUG): a mismatch fails it with CommError.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/store.h"
#include "tessera/comm/types.h"
#include "tessera/comm/work.h"
#include "tessera/common/error.h"

namespace tessera {

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  virtual Backend backend() const = 0;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }

  // In place on `t`. Avg divides the sum by size() (truncating for integer dtypes).
  WorkPtr allReduce(const at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // In place: root's `t` is copied into every rank's `t`.
  WorkPtr broadcast(const at::Tensor& t, int root);
  // In place on root's `t`; other ranks' `t` are left unchanged.
  WorkPtr reduce(const at::Tensor& t, int root, ReduceOp op = ReduceOp::Sum);
  // out.numel() == size() * in.numel(); out holds rank 0's input, then rank 1's, ...
  // `keep`: who keeps `out` and `in` alive (types.h).
  WorkPtr allGather(const at::Tensor& out, const at::Tensor& in, Keep keep = Keep::UntilDone);
  // in.numel() == size() * out.numel(); rank r gets the reduction of chunk r of every input.
  WorkPtr reduceScatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::Sum,
                        Keep keep = Keep::UntilDone);
  // Equal splits: in.numel() == out.numel(), divisible by size(); chunk j of rank i's input
  // lands in chunk i of rank j's output.
  WorkPtr allToAll(const at::Tensor& out, const at::Tensor& in);
  WorkPtr send(const at::Tensor& t, int peer);
  WorkPtr recv(const at::Tensor& t, int peer);
  // Sends and receives issued together (one NCCL group); completes when all are done.
  // Matching between two peers is by order: the k-th send from a to b meets b's k-th recv from a.
  WorkPtr batchP2P(const std::vector<P2POp>& ops);
  WorkPtr barrier();

  // Collective over this communicator: ranks with the same color >= 0 form a new
  // communicator, ordered by (key, rank); color < 0 → this rank gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name);

  // Local: fail all pending and future ops (e.g. from a watchdog). Idempotent.
  virtual void abort(const std::string& reason) = 0;

  // Options (device) for small scratch tensors this backend can communicate: split() and
  // callers that exchange metadata before they have tensors of their own (DDP construction).
  virtual at::TensorOptions scratchOptions() const = 0;

 protected:
  Communicator(int rank, int size, std::string name);

  virtual WorkPtr doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) = 0;
  virtual WorkPtr doBroadcast(const OpInfo& i, const at::Tensor& t, int root) = 0;
  virtual WorkPtr doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) = 0;
  virtual WorkPtr doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) = 0;
  virtual WorkPtr doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  virtual WorkPtr doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) = 0;
  virtual WorkPtr doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) = 0;
  virtual WorkPtr doBarrier(const OpInfo& i) = 0;
  // Called on every rank after the (color, key) of every rank is known; `members` are this
  // rank's new group's old ranks in new-rank order, empty when color < 0 (return nullptr;
  // backends whose split is collective over the parent still take part). `tag` is unique
  // per split and equal on all ranks.
  virtual std::shared_ptr<Communicator> doSplit(int color, const std::vector<int>& members,
                                                const std::string& name, const std::string& tag) = 0;
  // Device check for this backend (CPU vs CUDA device); throws with a message.
  virtual void checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const = 0;

  // Backends call this at construction: the rendezvous store and a key namespace unique to
  // this group and equal on its ranks, used by debug mode (split() derives the children's).
  void setSideChannel(StorePtr store, std::string ns);

  OpInfo nextOp(const char* op, std::string detail);
  void checkTensor(const OpInfo& i, const char* what, const at::Tensor& t) const;
  void checkPeer(const OpInfo& i, int peer) const;

  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> seq_{0};
  uint64_t splits_ = 0;

 private:
  // Debug check (collectives), then `launch()`, then the flight record and watchdog tracking.
  template <typename F>
  WorkPtr run(const OpInfo& i, F&& launch);

  std::atomic<bool> tracked_{false};
  bool fingerprints_;  // stamp OpInfo::fingerprint (fingerprint mode when this was made)
  StorePtr sideStore_;
  std::string sideNs_;
};

using CommPtr = std::shared_ptr<Communicator>;

}  // namespace tessera
