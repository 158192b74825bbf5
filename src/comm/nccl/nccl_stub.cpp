// Built when tessera has no NCCL/CUDA: the factories fail with a clear error.
#include "tessera/comm/backends.h"
#include "tessera/common/error.h"

namespace tessera {
bool ncclAvailable() { return false; }
std::string ncclVersion() { return ""; }
void setNcclOptions(bool, NcclCtaPolicy, bool) {}
CommPtr makeNcclCommunicator(const StorePtr&, int rank, int, int, const std::string& name,
                             std::chrono::milliseconds) {
  throw Error(fmt::format("tessera: communicator '{}' on rank {}: tessera was built without NCCL", name, rank));
}
int cudaDeviceCount() { return 0; }
std::string cudaPciBusId(int) { return ""; }
void cudaSelectDevice(int) {}
}  // namespace tessera
