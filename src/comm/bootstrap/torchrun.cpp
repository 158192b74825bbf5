// Bootstrap from torchrun's environment. RANK or WORLD_SIZE set means a torchrun-style launch:
// the other variables must then be there and agree (else a clear error, not a fallback to
// another launcher); MASTER_ADDR/MASTER_PORT alone are left to the SLURM bootstrap.
#include "tessera/comm/bootstrap/init.h"

#include <fmt/format.h>

#include <utility>

#include "common/env.h"
#include "tessera/common/error.h"

namespace tessera {

std::optional<LaunchInfo> detectTorchrun() {
  auto rank = env::getInt("RANK");
  auto world = env::getInt("WORLD_SIZE");
  auto addr = env::get("MASTER_ADDR");
  auto port = env::getInt("MASTER_PORT");
  if (!rank && !world) return std::nullopt;  // MASTER_* alone: e.g. a SLURM job choosing the store port
  if (!rank || !world || !addr || !port) {
    std::string missing;
    for (auto [name, set] : {std::pair{"RANK", bool(rank)}, {"WORLD_SIZE", bool(world)},
                             {"MASTER_ADDR", bool(addr)}, {"MASTER_PORT", bool(port)}}) {
      if (!set) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
    }
    throw Error(fmt::format("tessera torchrun bootstrap: RANK/WORLD_SIZE are set but {} {} not: a torchrun-style "
                            "launch needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
                            missing, missing.find(',') == std::string::npos ? "is" : "are"));
  }
  TESSERA_CHECK(*world >= 1 && *rank >= 0 && *rank < *world,
                "tessera torchrun bootstrap: RANK={} is not in [0, WORLD_SIZE={})", *rank, *world);
  LaunchInfo l;
  l.launcher = "torchrun";
  l.rank = static_cast<int>(*rank);
  l.worldSize = static_cast<int>(*world);
  l.localRank = static_cast<int>(env::getInt("LOCAL_RANK").value_or(l.rank));
  l.localWorldSize = static_cast<int>(env::getInt("LOCAL_WORLD_SIZE").value_or(l.worldSize));
  TESSERA_CHECK(l.localWorldSize >= 1 && l.localWorldSize <= l.worldSize && l.localRank >= 0 &&
                    l.localRank < l.localWorldSize,
                "tessera torchrun bootstrap: rank {}: LOCAL_RANK={} and LOCAL_WORLD_SIZE={} contradict each other or "
                "WORLD_SIZE={} (need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE)",
                l.rank, l.localRank, l.localWorldSize, l.worldSize);
  l.storeHost = *addr;
  TESSERA_CHECK(*port > 0 && *port < 65536, "MASTER_PORT={} is not a TCP port", *port);
  l.storePort = static_cast<uint16_t>(*port);
  auto agent = env::get("TORCHELASTIC_USE_AGENT_STORE");
  if (agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
    // The elastic agent runs the store; workers of this attempt share its prefix.
    l.hostsStore = false;
    l.storePrefix =
        fmt::format("/worker/attempt_{}/tessera", env::getInt("TORCHELASTIC_RESTART_COUNT").value_or(0));
  } else {
    l.hostsStore = l.rank == 0;
    l.ownStore = true;
    l.storePrefix = "tessera";
  }
  // torchrun's rendezvous id ("none" unless given or --standalone); absent in hand-made launches.
  l.jobId = env::get("TORCHELASTIC_RUN_ID").value_or("");
  return l;
}

}  // namespace tessera
