// The TESSERA_FAKE_WORLD probe's settings and world (contract in fake_world.h).
#include "fake_world.h"

#include <cstdlib>
#include <initializer_list>

#include <fmt/format.h>
#include <string>

#include "comm/fake/fake_communicator.h"
#include "common/env.h"
#include "tessera/common/error.h"
#include "timing.h"

namespace tessera::bench {
namespace {

double positiveEnv(const char* name, double fallback) {
  const auto v = env::get(name);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v->c_str(), &end);
  TESSERA_CHECK(end && *end == '\0' && d > 0, "{}={}: expected a positive number", name, *v);
  return d;
}

// One of `allowed`, or the fallback when unset or empty.
std::string choiceEnv(const char* name, std::initializer_list<const char*> allowed, const std::string& fallback) {
  const auto v = env::get(name);
  if (!v || v->empty()) return fallback;
  std::string list;
  for (const char* a : allowed) {
    if (*v == a) return *v;
    list += list.empty() ? a : std::string(", ") + a;
  }
  throw Error(fmt::format("{}={}: expected one of {}", name, *v, list));
}

void refuseOldNames() {
  for (const char* old : {"FAKE_WORLD", "FAKE_COMM_TIMED", "FAKE_COMM_BUSBW_GBPS", "FAKE_COMM_LATENCY_US",
                          "FAKE_COMM_CTAS", "FAKE_COMM_TRAFFIC", "FAKE_COMM_KEEP"}) {
    TESSERA_CHECK(!env::get(old), "{} is now TESSERA_{} (the benchmarks read only the new name)", old, old);
  }
  TESSERA_CHECK(!env::get("PP_EMULATE"), "PP_EMULATE is now tessera_bench_pp's flag --emulate P");
}

}  // namespace

std::string FakeWorld::systemSuffix() const {
  if (size == 0) return "";
  if (!timing.enabled) return "-nocomm";
  return timing.ignoreByCaller ? "-emulated-keepdone" : "-emulated";
}

FakeTiming fakeTimingFromEnv() {
  FakeTiming t;
  const bool timed = choiceEnv("TESSERA_FAKE_COMM_TIMED", {"0", "1"}, "0") == "1";
  if (env::get("TESSERA_FAKE_COMM_BUSBW_GBPS")) {
    const double bw = positiveEnv("TESSERA_FAKE_COMM_BUSBW_GBPS", t.otherGBps);
    t.allReduceGBps = t.allGatherGBps = t.reduceScatterGBps = t.otherGBps = bw;
  }
  t.latencyUs = positiveEnv("TESSERA_FAKE_COMM_LATENCY_US", t.latencyUs);
  t.ctas = static_cast<int>(envInt("TESSERA_FAKE_COMM_CTAS", 0));
  TESSERA_CHECK(t.ctas >= 0, "TESSERA_FAKE_COMM_CTAS={}: expected a count of SMs >= 0", t.ctas);
  t.traffic = choiceEnv("TESSERA_FAKE_COMM_TRAFFIC", {"0", "1"}, "0") == "1";
  TESSERA_CHECK(!t.traffic || t.ctas > 0,
                "TESSERA_FAKE_COMM_TRAFFIC=1 needs TESSERA_FAKE_COMM_CTAS > 0 (the SMs that stream memory for each op)");
  t.ignoreByCaller = choiceEnv("TESSERA_FAKE_COMM_KEEP", {"done", "contract"}, "contract") == "done";
  t.enabled = timed;
  return t;
}

FakeWorld fakeWorldFromEnv() {
  refuseOldNames();
  FakeWorld f;
  f.size = static_cast<int>(envInt("TESSERA_FAKE_WORLD", 0));
  TESSERA_CHECK(f.size == 0 || f.size >= 2,
                "TESSERA_FAKE_WORLD={}: the fake world needs at least 2 ranks (unset or 0: a real run)", f.size);
  f.timing = fakeTimingFromEnv();
  return f;
}

Context initWorld(const FakeWorld& fake) {
  if (fake.size == 0) return tessera::init();
  const auto launched = envInt("WORLD_SIZE", 1);
  TESSERA_CHECK(launched == 1, "TESSERA_FAKE_WORLD={}: the probe runs as one process (WORLD_SIZE={})", fake.size,
                launched);
  Context ctx;
  ctx.settings = Settings::fromEnvironment();  // as tessera::init() would
  configure(ctx.settings);
  ctx.launch.launcher = "fake";
  ctx.launch.worldSize = fake.size;
  ctx.device = singleProcessDevice();
  ctx.deviceDescription = ctx.device.str();
  ctx.world = makeFakeCommunicator(0, fake.size, ctx.device, "world", fake.timing);
  return ctx;
}

}  // namespace tessera::bench
