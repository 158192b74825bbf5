// The fake communicator's timing model (contract in fake_timing.h).
#include "comm/fake/fake_timing.h"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "tessera/common/error.h"

namespace tessera {

std::string FakeTiming::describe() const {
  if (!enabled) return "untimed";
  return fmt::format("latency {} us, busbw GB/s all-reduce {} all-gather {} reduce-scatter {} other {}, ctas {}{}",
                     latencyUs, allReduceGBps, allGatherGBps, reduceScatterGBps, otherGBps, ctas,
                     std::string(traffic ? ", memory traffic" : "") + (ignoreByCaller ? ", ByCaller ignored" : ""));
}

void validate(const FakeTiming& t) {
  if (!t.enabled) return;
  TESSERA_CHECK(t.latencyUs >= 0, "fake timing: latencyUs = {} must be >= 0", t.latencyUs);
  for (auto [name, v] : {std::pair<const char*, double>{"allReduceGBps", t.allReduceGBps},
                         {"allGatherGBps", t.allGatherGBps},
                         {"reduceScatterGBps", t.reduceScatterGBps},
                         {"otherGBps", t.otherGBps}}) {
    TESSERA_CHECK(v > 0, "fake timing: {} = {} must be > 0", name, v);
  }
  TESSERA_CHECK(t.ctas >= 0, "fake timing: ctas = {} must be >= 0", t.ctas);
  TESSERA_CHECK(!t.traffic || t.ctas > 0, "fake timing: traffic needs ctas > 0 (the SMs that stream memory for each op)");
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
