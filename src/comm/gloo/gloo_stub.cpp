// Built when tessera has no Gloo (e.g. PyTorch wheels ship no Gloo headers).
#include "tessera/comm/backends.h"
#include "tessera/common/error.h"

namespace tessera {
bool glooAvailable() { return false; }
void setGlooDevice(const std::string&, const std::string&) {}
CommPtr makeGlooCommunicator(const StorePtr&, int rank, int, const std::string& name, std::chrono::milliseconds) {
  throw Error(fmt::format("tessera: communicator '{}' on rank {}: tessera was built without Gloo", name, rank));
}
}  // namespace tessera
