// Bootstrap from torchrun's environment.
#include "comm/bootstrap/init.h"
#include "common/env.h"
#include "common/error.h"

namespace tessera {

std::optional<LaunchInfo> detectTorchrun() {
  auto rank = env::getInt("RANK");
  auto world = env::getInt("WORLD_SIZE");
  auto addr = env::get("MASTER_ADDR");
  auto port = env::getInt("MASTER_PORT");
  if (!rank || !world || !addr || !port) return std::nullopt;
  LaunchInfo l;
  l.launcher = "torchrun";
  l.rank = static_cast<int>(*rank);
  l.worldSize = static_cast<int>(*world);
  l.localRank = static_cast<int>(env::getInt("LOCAL_RANK").value_or(l.rank));
  l.localWorldSize = static_cast<int>(env::getInt("LOCAL_WORLD_SIZE").value_or(l.worldSize));
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
    l.storePrefix = "tessera";
  }
  return l;
}

}  // namespace tessera
