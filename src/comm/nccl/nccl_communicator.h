#pragma once
// NcclCommunicator: CUDA tensors over NCCL. Internal header: the public entry point is
// makeNcclCommunicator() in comm/backends.h; no NCCL or CUDA type appears here.
//
// Streams: each communicator owns one CUDA stream, of the device's greatest priority unless
// setNcclOptions said otherwise (TESSERA_NCCL_STREAM_PRIORITY=normal). An op records an
// event on the caller's *current* stream (LibTorch's current stream of the device) and makes
// its own stream wait on it, runs NCCL there and records a completion event. Work::wait()
// makes the caller's current stream wait on that event (no host synchronisation);
// Work::synchronize() blocks the host, polling the event, bounded by the op's timeout.
// Tensors stay referenced until the completion event has fired (no record_stream): the
// watchdog thread (see nccl_state.h) drops them. A timed-out op, an NCCL asynchronous error
// or abort() aborts the NCCL communicator: unfinished and later ops throw CommError.
// Init and splits go through a non-blocking NCCL communicator (config.blocking = 0), polled
// and bounded by the timeout; ops run on a blocking twin made right after (setNcclOptions in
// comm/backends.h can have them run on the non-blocking one).
#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/comm/store.h"

namespace tessera {
namespace nccl_detail {
struct NcclState;
}

class NcclCommunicator : public Communicator {
 public:
  // Collective over `size` processes: rank 0 makes the ncclUniqueId and shares it through
  // `store`. `device` is this process's CUDA device index.
  NcclCommunicator(const StorePtr& store, int rank, int size, int device, const std::string& name,
                   std::chrono::milliseconds timeout);
  // Takes an NCCL communicator already made (by doSplit). `state` owns it.
  NcclCommunicator(std::shared_ptr<nccl_detail::NcclState> state, std::chrono::milliseconds timeout);
  ~NcclCommunicator() override;

  Backend backend() const override { return Backend::Nccl; }
  void abort(const std::string& reason) override;
  int device() const { return device_; }

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
  // Orders the op after the caller's current stream, runs `launch(stream)` (the NCCL calls;
  // returns the last ncclResult_t) on the communicator's stream under its lock, records the
  // completion event and hands the op to the watchdog. Defined in nccl_communicator.cpp.
  template <typename F>
  WorkPtr enqueue(const OpInfo& i, std::vector<at::Tensor> keep, F&& launch);

  std::shared_ptr<nccl_detail::NcclState> st_;
  int device_;
};

}  // namespace tessera
