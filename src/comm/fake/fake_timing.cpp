// The fake communicator's timing model (contract in fake_timing.h).
#include "comm/fake/fake_timing.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace tessera {
namespace {

double positiveEnv(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  TESSERA_CHECK(end && *end == '\0' && d > 0, "{}={}: expected a positive number", name, v);
  return d;
}

}  // namespace

std::string FakeTiming::describe() const {
  if (!enabled) return "untimed";
  return fmt::format("latency {} us, busbw GB/s all-reduce {} all-gather {} reduce-scatter {} other {}, ctas {}{}",
                     latencyUs, allReduceGBps, allGatherGBps, reduceScatterGBps, otherGBps, ctas,
                     std::string(traffic ? ", memory traffic" : "") + (ignoreByCaller ? ", ByCaller ignored" : ""));
}

FakeTiming fakeTimingFromEnv() {
  FakeTiming t;
  const char* on = std::getenv("FAKE_COMM_TIMED");
  t.enabled = on && std::string(on) != "" && std::string(on) != "0";
  if (!t.enabled) return t;
  if (std::getenv("FAKE_COMM_BUSBW_GBPS")) {
    const double bw = positiveEnv("FAKE_COMM_BUSBW_GBPS", 0);
    t.allReduceGBps = t.allGatherGBps = t.reduceScatterGBps = t.otherGBps = bw;
  }
  t.latencyUs = positiveEnv("FAKE_COMM_LATENCY_US", t.latencyUs);
  if (std::getenv("FAKE_COMM_CTAS") && *std::getenv("FAKE_COMM_CTAS") && std::string(std::getenv("FAKE_COMM_CTAS")) != "0")
    t.ctas = static_cast<int>(positiveEnv("FAKE_COMM_CTAS", 0));
  const char* traffic = std::getenv("FAKE_COMM_TRAFFIC");
  if (traffic && *traffic) {
    TESSERA_CHECK(std::string(traffic) == "0" || std::string(traffic) == "1", "FAKE_COMM_TRAFFIC={}: expected 0 or 1",
                  traffic);
    t.traffic = std::string(traffic) == "1";
    TESSERA_CHECK(!t.traffic || t.ctas > 0,
                  "FAKE_COMM_TRAFFIC=1 needs FAKE_COMM_CTAS > 0 (the SMs that stream memory for each op)");
  }
  const char* keep = std::getenv("FAKE_COMM_KEEP");
  if (keep && *keep) {
    TESSERA_CHECK(std::string(keep) == "done" || std::string(keep) == "contract",
                  "FAKE_COMM_KEEP={}: expected 'done' (keep every op's tensors until it completes) or 'contract'", keep);
    t.ignoreByCaller = std::string(keep) == "done";
  }
  return t;
}

double fakeOpSeconds(const FakeTiming& t, const std::string& kind, double bytes, int n) {
  const double part = n > 1 ? static_cast<double>(n - 1) / n : 0.0;
  double moved = bytes, gbps = t.otherGBps;
  if (kind == "all_reduce") {
    moved = 2 * part * bytes;
    gbps = t.allReduceGBps;
  } else if (kind == "all_gather") {
    moved = part * bytes;
    gbps = t.allGatherGBps;
  } else if (kind == "reduce_scatter") {
    moved = part * bytes;
    gbps = t.reduceScatterGBps;
  } else if (kind == "all_to_all") {
    moved = part * bytes;
  } else if (kind == "barrier") {
    moved = 0;
  }
  return t.latencyUs * 1e-6 + moved / (gbps * 1e9);
}

}  // namespace tessera
