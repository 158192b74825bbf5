#pragma once
// A communicator for tests that forwards every op to another one and logs, on an EventLog,
// "launch:<op>" when an op is issued and "wait:<op>" when its Work is waited on (or
// synchronized). split() is not supported (throws). Device checks are left to the inner
// communicator. Used to assert which collectives a layer issues, in which order, and that a
// group of one issues none.
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::testing {

// The events of one rank, in the order they happened on the calling threads.
struct EventLog {
  std::mutex mu;
  std::vector<std::string> events;
  void add(std::string e) {
    std::lock_guard<std::mutex> l(mu);
    events.push_back(std::move(e));
  }
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> l(mu);
    return std::exchange(events, {});
  }
};

class RecordingWork : public Work {
 public:
  RecordingWork(OpInfo i, WorkPtr inner, EventLog* log) : Work(std::move(i)), inner_(std::move(inner)), log_(log) {}
  void wait() override {
    log_->add("wait:" + info_.op);
    inner_->wait();
  }
  void synchronize() override {
    log_->add("wait:" + info_.op);
    inner_->synchronize();
  }
  bool completed() override { return inner_->completed(); }

 private:
  WorkPtr inner_;
  EventLog* log_;
};

// Forwards every op to `inner` and logs "launch:<op>" / "wait:<op>".
class RecordingComm : public Communicator {
 public:
  RecordingComm(CommPtr inner, EventLog* log)
      : Communicator(inner->rank(), inner->size(), "rec:" + inner->name()), inner_(std::move(inner)), log_(log) {}
  Backend backend() const override { return inner_->backend(); }
  void abort(const std::string& r) override { inner_->abort(r); }
  WorkPtr last() const { return last_; }

 protected:
  WorkPtr wrap(const OpInfo& i, WorkPtr w) {
    log_->add("launch:" + i.op);
    return last_ = std::make_shared<RecordingWork>(i, std::move(w), log_);
  }
  WorkPtr doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) override {
    return wrap(i, inner_->allReduce(t, op));
  }
  WorkPtr doBroadcast(const OpInfo& i, const at::Tensor& t, int root) override {
    return wrap(i, inner_->broadcast(t, root));
  }
  WorkPtr doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) override {
    return wrap(i, inner_->reduce(t, root, op));
  }
  WorkPtr doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override {
    return wrap(i, inner_->allGather(out, in));
  }
  WorkPtr doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    return wrap(i, inner_->reduceScatter(out, in, op));
  }
  WorkPtr doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override {
    return wrap(i, inner_->allToAll(out, in));
  }
  WorkPtr doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) override {
    return wrap(i, inner_->batchP2P(ops));
  }
  WorkPtr doBarrier(const OpInfo& i) override { return wrap(i, inner_->barrier()); }
  std::shared_ptr<Communicator> doSplit(int, const std::vector<int>&, const std::string&,
                                        const std::string&) override {
    throw std::runtime_error("RecordingComm: split is not supported");
  }
  void checkDevice(const OpInfo&, const char*, const at::Tensor&) const override {}  // inner checks
  at::TensorOptions scratchOptions() const override { return at::TensorOptions(); }

 private:
  CommPtr inner_;
  EventLog* log_;
  WorkPtr last_;
};

}  // namespace tessera::testing
