// The FAKE_WORLD probe's world (contract in fake_world.h).
#include "fake_world.h"

#include "comm/fake/fake_communicator.h"
#include "common/error.h"
#include "timing.h"

namespace tessera::bench {

int fakeWorldSize() {
  const auto n = envInt("FAKE_WORLD", 0);
  TESSERA_CHECK(n == 0 || n >= 2, "FAKE_WORLD={}: the fake world needs at least 2 ranks (unset: a real run)", n);
  return static_cast<int>(n);
}

Context initWorld() {
  const int n = fakeWorldSize();
  if (n == 0) return tessera::init();
  TESSERA_CHECK(envInt("WORLD_SIZE", 1) == 1, "FAKE_WORLD={}: the probe runs as one process (WORLD_SIZE={})", n,
                envInt("WORLD_SIZE", 1));
  Context ctx;
  ctx.settings = Settings::fromEnvironment();  // as tessera::init() would
  configure(ctx.settings);
  ctx.launch.launcher = "fake";
  ctx.launch.worldSize = n;
  ctx.device = singleProcessDevice();
  ctx.deviceDescription = ctx.device.str();
  ctx.world = makeFakeCommunicator(0, n, ctx.device, "world", fakeTimingFromEnv());
  return ctx;
}

}  // namespace tessera::bench
