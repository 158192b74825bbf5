// The communicator that moves no data (contract in fake_communicator.h).
#include "comm/fake/fake_communicator.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "comm/fake/timed_stream.h"
#include "tessera/common/error.h"

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

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, int size, at::Device device, const std::string& name, FakeTiming timing)
      : Communicator(rank, size, name), device_(device), timing_(timing) {
    if (timing_.enabled) {
      validate(timing_);
      TESSERA_CHECK(device_.is_cuda(), "fake communicator '{}': timing (FakeTiming::enabled) needs a CUDA device, not {}",
                    name, device_.str());
      stream_ = fake_detail::makeTimedStream(device_.index(), timing_.ctas, timing_.traffic);
    }
  }
  Backend backend() const override { return device_.is_cuda() ? Backend::Nccl : Backend::Gloo; }
  void abort(const std::string&) override {}

 protected:
  WorkPtr doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp) override { return op(i, nbytes(t), {}, {t}); }
  WorkPtr doBroadcast(const OpInfo& i, const at::Tensor& t, int) override { return op(i, nbytes(t), {}, {t}); }
  WorkPtr doReduce(const OpInfo& i, const at::Tensor& t, int, ReduceOp) override { return op(i, nbytes(t), {}, {t}); }
  WorkPtr doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override {
    std::vector<fake_detail::Copy> slots;  // every slot gets this rank's input
    for (int r = 0; r < size_; ++r)
      slots.push_back({static_cast<char*>(out.data_ptr()) + r * nbytes(in), in.data_ptr(), static_cast<size_t>(nbytes(in))});
    return op(i, nbytes(out), slots, {out, in});
  }
  WorkPtr doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp) override {
    const fake_detail::Copy mine{out.data_ptr(), static_cast<const char*>(in.data_ptr()) + rank_ * nbytes(out),
                                 static_cast<size_t>(nbytes(out))};
    return op(i, nbytes(in), {mine}, {out, in});
  }
  WorkPtr doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) override {
    return op(i, nbytes(in), {}, {out, in});
  }
  WorkPtr doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) override {
    int64_t sent = 0, received = 0;
    std::vector<at::Tensor> keep;
    for (const auto& o : ops) {
      (o.kind == P2POp::Send ? sent : received) += nbytes(o.tensor);
      keep.push_back(o.tensor);
    }
    return op(i, std::max(sent, received), {}, std::move(keep));
  }
  WorkPtr doBarrier(const OpInfo& i) override { return op(i, 0, {}, {}); }
  std::shared_ptr<Communicator> doSplit(int color, const std::vector<int>& members, const std::string& name,
                                        const std::string&) override {
    if (color < 0) return nullptr;
    const auto me = std::find(members.begin(), members.end(), rank_);
    TESSERA_CHECK(me != members.end(), "fake communicator: rank {} is not among the members of its split '{}'", rank_, name);
    return std::make_shared<FakeCommunicator>(static_cast<int>(me - members.begin()),
                                              static_cast<int>(members.size()), device_, name, timing_);
  }
  void checkDevice(const OpInfo& i, const char* what, const at::Tensor& t) const override {
    TESSERA_CHECK(t.device() == device_, "{}: {} tensor is on {}, the fake communicator on {}", i.describe(), what,
                  t.device().str(), device_.str());
  }
  at::TensorOptions scratchOptions() const override { return at::TensorOptions().device(device_); }

 private:
  // Untimed: the copies now, on the caller's stream, and a finished Work. Timed: on the stream,
  // after the modelled time (fake_timing.h).
  WorkPtr op(const OpInfo& i, int64_t bytes, const std::vector<fake_detail::Copy>& copies, std::vector<at::Tensor> keep) {
    if (!stream_) {
      for (const auto& c : copies) copyNow(c);
      return std::make_shared<DoneWork>(i);
    }
    if (i.keep == Keep::ByCaller && !timing_.ignoreByCaller) keep.clear();
    return stream_->run(i, fakeOpSeconds(timing_, i.op, static_cast<double>(bytes), size_), copies, std::move(keep));
  }
  void copyNow(const fake_detail::Copy& c) const {
    if (c.bytes == 0 || c.dst == c.src) return;
    const auto opts = at::TensorOptions().dtype(at::kByte).device(device_);
    const int64_t n = static_cast<int64_t>(c.bytes);
    at::from_blob(c.dst, {n}, opts).copy_(at::from_blob(const_cast<void*>(c.src), {n}, opts));
  }

  at::Device device_;
  FakeTiming timing_;
  std::shared_ptr<fake_detail::TimedStream> stream_;
};

}  // namespace

CommPtr makeFakeCommunicator(int rank, int size, const at::Device& device, const std::string& name,
                             const FakeTiming& timing) {
  TESSERA_CHECK(size >= 1 && rank >= 0 && rank < size, "fake communicator '{}': rank {} of {} is not a rank", name,
                rank, size);
  return std::make_shared<FakeCommunicator>(rank, size, device, name, timing);
}

}  // namespace tessera
