// Collective times over the cluster's links (contract in plan/costs.h).
#include <algorithm>
#include <string>

#include "plan/costs.h"
#include "tessera/common/error.h"

namespace tessera::plan {

// nccl-tests' bus bandwidth: a ring all-reduce moves 2 (n − 1) / n of the buffer per rank, an
// all-gather or reduce-scatter (n − 1) / n of the gathered size, a send its message.
double Collectives::ms(const char* op, double bytes, int n, int span) const {
  if (n <= 1 || bytes <= 0) return 0;
  const bool inNode = span <= cluster.gpusPerNode;
  const Link& link = inNode ? cluster.intra : cluster.inter;
  const std::string o = op;
  double factor = 1;
  if (o == "all_reduce") {
    factor = 2.0 * (n - 1) / n;
  } else if (o == "all_gather" || o == "reduce_scatter") {
    factor = static_cast<double>(n - 1) / n;
  } else {
    TESSERA_CHECK(o == "send_recv", "plan: unknown collective '{}'", o);
  }
  const double gbs = link.busbw(o, bytes, n);
  TESSERA_CHECK(gbs > 0, "plan: link '{}' has no bandwidth for {}", link.name, o);
  // A group across nodes runs at the network's per-GPU bus bandwidth and latency.
  return link.latencyUs * 1e-3 + bytes * factor / (gbs * 1e6);
}

}  // namespace tessera::plan
