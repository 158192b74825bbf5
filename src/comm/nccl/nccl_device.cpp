// The CUDA device queries and NCCL factory of comm/backends.h (built with NCCL).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "tessera/comm/backends.h"
#include "comm/watchdog/watchdog.h"
#include "comm/nccl/nccl_check.h"
#include "comm/nccl/nccl_communicator.h"

namespace tessera {

bool ncclAvailable() { return true; }

std::string ncclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // Since NCCL 2.9: major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

CommPtr makeNcclCommunicator(const StorePtr& store, int rank, int size, int device, const std::string& name,
                             std::chrono::milliseconds timeout) {
  auto c = std::make_shared<NcclCommunicator>(store, rank, size, device, name, timeout);
  watchdog::track(c);
  return c;
}

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver, no device: not an error here
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cudaPciBusId(int device) {
  char buf[64] = {0};
  if (cudaDeviceGetPCIBusId(buf, sizeof(buf), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return buf;
}

void cudaSelectDevice(int device) { TESSERA_CUDA_CHECK(cudaSetDevice(device), -1); }

}  // namespace tessera
