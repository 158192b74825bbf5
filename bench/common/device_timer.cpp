#include "device_timer.h"

#include "tessera/common/error.h"
#ifdef TESSERA_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl/cuda_stream.h"
#endif

namespace tessera::bench {

#ifdef TESSERA_HAVE_NCCL
namespace {
void cudaOk(cudaError_t e, const char* what) {
  TESSERA_CHECK(e == cudaSuccess, "DeviceTimer: {} failed: {}", what, cudaGetErrorString(e));
}
}  // namespace
#endif

DeviceTimer::DeviceTimer(const at::Device& d) : device_(d) {
#ifndef TESSERA_HAVE_NCCL
  TESSERA_CHECK(!d.is_cuda(), "DeviceTimer: {} needs a build with CUDA (TESSERA_HAVE_NCCL)", d.str());
#endif
}

DeviceTimer::~DeviceTimer() {
#ifdef TESSERA_HAVE_NCCL
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

int DeviceTimer::mark() {
  if (used_ == static_cast<int>(host_.size())) host_.emplace_back();
  host_[used_] = std::chrono::steady_clock::now();
  if (!device_.is_cuda()) return used_++;
#ifdef TESSERA_HAVE_NCCL
  if (used_ == static_cast<int>(events_.size())) {
    cudaEvent_t e;
    cudaOk(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
  }
  cudaOk(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_]),
                         static_cast<cudaStream_t>(cuda::currentStream(device_.index()))),
         "cudaEventRecord");
#endif
  return used_++;
}

double DeviceTimer::hostMs(int a, int b) {
  TESSERA_CHECK(a >= 0 && b >= 0 && a < used_ && b < used_, "DeviceTimer: marks {} and {} (have {})", a, b, used_);
  return std::chrono::duration<double, std::milli>(host_[b] - host_[a]).count();
}

double DeviceTimer::ms(int a, int b) {
  if (!device_.is_cuda()) return hostMs(a, b);
  TESSERA_CHECK(a >= 0 && b >= 0 && a < used_ && b < used_, "DeviceTimer: marks {} and {} (have {})", a, b, used_);
  float out = 0;
#ifdef TESSERA_HAVE_NCCL
  cudaOk(cudaEventElapsedTime(&out, static_cast<cudaEvent_t>(events_[a]), static_cast<cudaEvent_t>(events_[b])),
         "cudaEventElapsedTime");
#endif
  return out;
}

void DeviceTimer::clear() { used_ = 0; }

}  // namespace tessera::bench
