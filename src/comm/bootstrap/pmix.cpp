// Bootstrap through PMIx (srun --mpi=pmix, mpirun). Placeholder until implemented.
#include "comm/bootstrap/init.h"

namespace tessera {
std::optional<LaunchInfo> detectPmix() { return std::nullopt; }
}  // namespace tessera
