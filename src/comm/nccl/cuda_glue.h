#pragma once
// Internal CUDA helpers of the NCCL backend (nccl/*.cpp) and of the timed fake communicator
// (fake/timed_stream.cpp), which orders its ops as the NCCL backend does.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::nccl_detail {

// Makes `device` current for the scope; restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// The caller's current stream on `device` (see comm/nccl/cuda_stream.h). Call with `device`
// current (the legacy default stream is the current device's).
cudaStream_t callerStream(int device);

// Integer average after an ncclSum: t[i] /= divisor (truncating), enqueued on `stream`.
// `elemBytes` is 4 (int32) or 8 (int64). Defined in nccl_kernels.cu.
void launchIntDivide(void* data, long long numel, int elemBytes, int divisor, cudaStream_t stream);
// Fingerprint check (comm/watchdog/fingerprint.h), enqueued on `stream`: writes the 4 `words` to
// `dst`; compares the 4 * `ranks` gathered words `all`: on a mismatch, unless `host` (mapped,
// 1 + 4 * ranks words) already holds one, writes them at host[1..] and then `seq` at host[0].
void launchFingerprintWrite(int64_t* dst, const int64_t* words, cudaStream_t stream);
void launchFingerprintCompare(const int64_t* all, int ranks, int64_t seq, int64_t* host, cudaStream_t stream);

}  // namespace tessera::nccl_detail
