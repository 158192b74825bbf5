// The ops of NcclCommunicator: each orders itself after the caller's current stream, runs
// NCCL on the communicator's stream and returns a Work (see nccl_communicator.h).
#include <fmt/format.h>

#include "comm/nccl/cuda_glue.h"
#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_state.h"
#include "comm/watchdog/fingerprint.h"
#include "tessera/common/error.h"

namespace tessera {

using nccl_detail::DeviceGuard;
using nccl_detail::NcclWork;

namespace {

ncclDataType_t ncclType(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    default: throw Error(fmt::format("tessera: dtype {} has no NCCL type here", dtypeName(t)));
  }
}

bool isIntegral(c10::ScalarType t) { return t == at::kInt || t == at::kLong; }

// Integer Avg runs as Sum followed by a truncating division on the communicator's stream.
ncclRedOp_t ncclOp(ReduceOp op, c10::ScalarType t) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return isIntegral(t) ? ncclSum : ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// What the Work references until the op completes: nothing for Keep::ByCaller.
std::vector<at::Tensor> kept(const OpInfo& i, std::vector<at::Tensor> ts) {
  if (i.keep == Keep::ByCaller) ts.clear();
  return ts;
}

}  // namespace

template <typename F>
WorkPtr NcclCommunicator::enqueue(const OpInfo& i, std::vector<at::Tensor> keep, F&& launch) {
  std::unique_lock<std::timed_mutex> lock(st_->opMu);
  auto broken = st_->broken();
  if (!broken.empty()) {
    throw CommError(fmt::format("tessera: {} not run: NCCL communicator '{}' is broken: {}", i.describe(), name_,
                                broken));
  }
  DeviceGuard g(device_);
  ncclComm_t c = st_->comm;
  cudaStream_t s = st_->stream;
  // NCCL calls on a non-blocking communicator may return ncclInProgress (e.g. while the first
  // op connects): wait for it before anything else goes on the stream.
  auto settle = [&](ncclResult_t r) {
    if (r == ncclInProgress) st_->waitNotInProgress(c, i.describe(), timeout_);
  };
  try {
    TESSERA_CUDA_CHECK(cudaEventRecord(st_->ready, nccl_detail::callerStream(device_)), rank_);
    TESSERA_CUDA_CHECK(cudaStreamWaitEvent(s, st_->ready, 0), rank_);
    if (i.fingerprint[0] != 0) {  // fingerprint.h: gathered and compared on the stream; the watchdog reads the result
      int64_t* mine = st_->fpGathered + static_cast<size_t>(rank_) * fingerprint::kWords;
      nccl_detail::launchFingerprintWrite(mine, i.fingerprint.data(), s);
      settle(TESSERA_NCCL_CHECK(ncclAllGather(mine, st_->fpGathered, fingerprint::kWords, ncclInt64, c, s), rank_, c));
      nccl_detail::launchFingerprintCompare(st_->fpGathered, size_, static_cast<int64_t>(i.seq), st_->fpHostOnDevice, s);
      TESSERA_CUDA_CHECK(cudaGetLastError(), rank_);
    }
    launch(c, s, settle);
    cudaEvent_t done = st_->takeEvent();
    cudaError_t e = cudaEventRecord(done, s);
    if (e != cudaSuccess) st_->giveEvent(done);
    TESSERA_CUDA_CHECK(e, rank_);
    auto w = std::make_shared<NcclWork>(i, st_, done, std::move(keep), timeout_);
    st_->track(w);
    return w;
  } catch (const std::exception& e) {
    lock.unlock();
    auto msg = fmt::format("tessera: {} failed: {}", i.describe(), e.what());
    st_->fail(msg);
    throw CommError(msg);
  }
}

#define NCHECK(call) TESSERA_NCCL_CHECK(call, rank_, c)

WorkPtr NcclCommunicator::doAllReduce(const OpInfo& i, const at::Tensor& t, ReduceOp op) {
  auto dt = t.scalar_type();
  return enqueue(i, {t}, [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), ncclType(dt), ncclOp(op, dt), c, s)));
    if (op == ReduceOp::Avg && isIntegral(dt))
      nccl_detail::launchIntDivide(t.data_ptr(), t.numel(), static_cast<int>(t.element_size()), size_, s);
  });
}

WorkPtr NcclCommunicator::doBroadcast(const OpInfo& i, const at::Tensor& t, int root) {
  return enqueue(i, {t}, [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), ncclType(t.scalar_type()), root, c, s)));
  });
}

WorkPtr NcclCommunicator::doReduce(const OpInfo& i, const at::Tensor& t, int root, ReduceOp op) {
  auto dt = t.scalar_type();
  return enqueue(i, {t}, [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), ncclType(dt), ncclOp(op, dt), root, c, s)));
    if (op == ReduceOp::Avg && isIntegral(dt) && rank_ == root)
      nccl_detail::launchIntDivide(t.data_ptr(), t.numel(), static_cast<int>(t.element_size()), size_, s);
  });
}

WorkPtr NcclCommunicator::doAllGather(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  return enqueue(i, kept(i, {out, in}), [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), ncclType(in.scalar_type()), c, s)));
  });
}

WorkPtr NcclCommunicator::doReduceScatter(const OpInfo& i, const at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  auto dt = in.scalar_type();
  return enqueue(i, kept(i, {out, in}), [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(
        ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), ncclType(dt), ncclOp(op, dt), c, s)));
    if (op == ReduceOp::Avg && isIntegral(dt))
      nccl_detail::launchIntDivide(out.data_ptr(), out.numel(), static_cast<int>(out.element_size()), size_, s);
  });
}

WorkPtr NcclCommunicator::doAllToAll(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  TESSERA_CHECK(out.data_ptr() != in.data_ptr() || in.numel() == 0,
                "{}: input and output are the same memory; NCCL's all-to-all is not in place", i.describe());
  return enqueue(i, {out, in}, [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    size_t chunk = static_cast<size_t>(in.numel() / size_);
    size_t chunkBytes = chunk * in.element_size();
    auto dt = ncclType(in.scalar_type());
    NCHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      NCHECK(ncclSend(bytes(in) + p * chunkBytes, chunk, dt, p, c, s));
      NCHECK(ncclRecv(bytes(out) + p * chunkBytes, chunk, dt, p, c, s));
    }
    settle(NCHECK(ncclGroupEnd()));
  });
}

WorkPtr NcclCommunicator::doBatchP2P(const OpInfo& i, const std::vector<P2POp>& ops) {
  std::vector<at::Tensor> keep;
  for (const auto& o : ops) keep.push_back(o.tensor);
  return enqueue(i, std::move(keep), [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    NCHECK(ncclGroupStart());
    for (const auto& o : ops) {
      const auto& t = o.tensor;
      if (o.kind == P2POp::Send) {
        NCHECK(ncclSend(t.data_ptr(), t.numel(), ncclType(t.scalar_type()), o.peer, c, s));
      } else {
        NCHECK(ncclRecv(t.data_ptr(), t.numel(), ncclType(t.scalar_type()), o.peer, c, s));
      }
    }
    settle(NCHECK(ncclGroupEnd()));
  });
}

WorkPtr NcclCommunicator::doBarrier(const OpInfo& i) {
  return enqueue(i, {}, [&](ncclComm_t c, cudaStream_t s, auto& settle) {
    settle(NCHECK(ncclAllReduce(st_->scratch, st_->scratch, 1, ncclFloat32, ncclSum, c, s)));
  });
}

}  // namespace tessera
