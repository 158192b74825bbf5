// The communicator that moves no data (contract in fake_communicator.h).
#include "comm/fake/fake_communicator.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "common/error.h"

namespace tessera {
namespace {

// An op of the fake world: finished when it is issued.
class DoneWork : public Work {
 public:
  explicit DoneWork(OpInfo i) : Work(std::move(i)) {}
  void wait() override {}
  void synchronize() override {}
  bool completed() override { return true; }
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, at::Device device, const std::string& name)
      : Communicator(rank, size, name), device_(device) {}
  Backend backend() const override { return device_.is_cuda() ? Backend::Nccl : Backend::Gloo; }
  void abort(const std::string&) override {}

 protected:
  WorkPtr doAllReduce(const OpInfo& i, const at::Tensor&, ReduceOp) override { return done(i); }
  WorkPtr doBroadcast(const OpInfo& i, const at::Tensor&, int) override { return done(i); }
  WorkPtr doReduce(const OpInfo& i, const at::Tensor&, int, ReduceOp) override { return done(i); }
  WorkPtr doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override {
    const auto src = in.reshape({-1});
    const auto slots = out.view({size_, -1});
    for (int r = 0; r < size_; ++r) slots[r].copy_(src);  // contiguous slot copies (device memcpy)
    return done(i);
  }
  WorkPtr doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp) override {
    out.view({-1}).copy_(in.view({size_, -1})[rank_]);
    return done(i);
  }
  WorkPtr doAllToAll(const OpInfo& i, const at::Tensor&, const at::Tensor&) override { return done(i); }
  WorkPtr doBatchP2P(const OpInfo& i, const std::vector<P2POp>&) override { return done(i); }
  WorkPtr doBarrier(const OpInfo& i) override { return done(i); }
  std::shared_ptr<Communicator> doSplit(int color, const std::vector<int>& members, const std::string& name,
                                        const std::string&) override {
    if (color < 0) return nullptr;
    const auto me = std::find(members.begin(), members.end(), rank_);
    TESSERA_CHECK(me != members.end(), "fake communicator: rank {} is not among the members of its split '{}'", rank_, name);
    return std::make_shared<FakeCommunicator>(static_cast<int>(me - members.begin()),
                                              static_cast<int>(members.size()), device_, name);
  }
  void checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const override {
    TESSERA_CHECK(t.device() == device_, "{}: {} tensor is on {}, the fake communicator on {}", i.describe(), what,
                  t.device().str(), device_.str());
  }
  at::TensorOptions scratchOptions() const override { return at::TensorOptions().device(device_); }

 private:
  static WorkPtr done(const OpInfo& i) { return std::make_shared<DoneWork>(i); }
  at::Device device_;
};

}  // namespace

CommPtr makeFakeCommunicator(int rank, int size, const at::Device& device, const std::string& name) {
  TESSERA_CHECK(size >= 1 && rank >= 0 && rank < size, "fake communicator '{}': rank {} of {} is not a rank", name,
                rank, size);
  return std::make_shared<FakeCommunicator>(rank, size, device, name);
}

}  // namespace tessera
