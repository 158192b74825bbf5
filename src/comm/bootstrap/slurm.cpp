// Bootstrap from SLURM's environment. Placeholder until implemented.
#include "comm/bootstrap/init.h"

namespace tessera {
std::optional<LaunchInfo> detectSlurm() { return std::nullopt; }
}  // namespace tessera
