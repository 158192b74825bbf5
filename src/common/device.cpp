#include "tessera/common/device.h"

#include <sys/resource.h>
#include <torch/cuda.h>

#include "tessera/common/error.h"

#ifdef TESSERA_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace tessera {

namespace {
[[noreturn]] void noCuda(const char* what) {
  throw Error(fmt::format("{}: this tessera was built against a LibTorch without CUDA", what));
}
}  // namespace

void useDevice(const at::Device& d) {
  if (!d.is_cuda()) return;
#ifdef TESSERA_TORCH_CUDA
  c10::cuda::set_device(d.index());
#else
  noCuda("useDevice");
#endif
}

void synchronizeDevice(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

void resetPeakMemory(const at::Device& d) {
  if (!d.is_cuda()) return;
#ifdef TESSERA_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#else
  noCuda("resetPeakMemory");
#endif
}

double peakMemoryGiB(const at::Device& d) {
  if (!d.is_cuda()) {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) * 1024.0 / (1ull << 30);  // ru_maxrss is in KiB on Linux
  }
#ifdef TESSERA_TORCH_CUDA
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
  return static_cast<double>(stats.allocated_bytes[0].peak) / (1ull << 30);  // [0]: aggregate
#else
  noCuda("peakMemoryGiB");
#endif
}

double allocatedMemoryGiB(const at::Device& d) {
  if (!d.is_cuda()) return 0.0;
#ifdef TESSERA_TORCH_CUDA
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
  return static_cast<double>(stats.allocated_bytes[0].current) / (1ull << 30);
#else
  noCuda("allocatedMemoryGiB");
#endif
}

double totalMemoryGiB(const at::Device& d) {
  if (!d.is_cuda()) return 0.0;
#ifdef TESSERA_TORCH_CUDA
  c10::cuda::CUDAGuard guard(d.index());
  size_t freeBytes = 0, totalBytes = 0;
  TESSERA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess, "totalMemoryGiB: cudaMemGetInfo failed on {}",
                d.str());
  return static_cast<double>(totalBytes) / (1ull << 30);
#else
  noCuda("totalMemoryGiB");
#endif
}

std::string deviceName(const at::Device& d) {
  if (!d.is_cuda()) return "CPU";
#ifdef TESSERA_TORCH_CUDA
  cudaDeviceProp prop{};
  TESSERA_CHECK(cudaGetDeviceProperties(&prop, d.index()) == cudaSuccess,
                "deviceName: cudaGetDeviceProperties failed on {}", d.str());
  return prop.name;
#else
  noCuda("deviceName");
#endif
}

}  // namespace tessera
