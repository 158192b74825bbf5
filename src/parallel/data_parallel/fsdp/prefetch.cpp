#include "parallel/data_parallel/fsdp/prefetch.h"

#include <algorithm>

namespace tessera::fsdp {

std::vector<int> PrefetchPlanner::pick(const std::vector<int>& order, int current, const std::vector<size_t>& bytes,
                                       const std::vector<bool>& alive, size_t aliveBytes) const {
  std::vector<int> out;
  if (budget_ == 0) return out;
  auto it = std::find(order.begin(), order.end(), current);
  if (it == order.end()) return out;
  for (++it; it != order.end(); ++it) {
    const int u = *it;
    if (alive[u] || std::find(out.begin(), out.end(), u) != out.end()) continue;
    if (aliveBytes + bytes[u] > budget_) break;
    aliveBytes += bytes[u];
    out.push_back(u);
  }
  return out;
}

}  // namespace tessera::fsdp
