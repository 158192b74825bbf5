#include "parallel/data_parallel/ddp/buckets.h"

#include <fmt/format.h>

#include <map>

#include "tessera/common/error.h"

namespace tessera::ddp {

std::vector<std::vector<int>> assignBuckets(const std::vector<int>& order, const std::vector<BucketParam>& params,
                                            size_t cap, size_t firstCap) {
  auto problem = orderProblem(order, params.size());
  TESSERA_CHECK(problem.empty(), "assignBuckets: the order is not a permutation of the {} parameters: {}",
                params.size(), problem);
  struct Open {
    std::vector<int> members;
    size_t bytes = 0;
    bool first = true;
  };
  std::map<int, Open> open;
  std::vector<int> groupOrder;
  std::vector<std::vector<int>> out;
  for (int i : order) {
    const auto& p = params[i];
    auto [it, inserted] = open.try_emplace(p.group);
    if (inserted) groupOrder.push_back(p.group);
    Open& b = it->second;
    b.members.push_back(i);
    b.bytes += p.bytes;
    if (b.bytes >= (b.first ? firstCap : cap)) {
      out.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  for (int g : groupOrder) {
    if (!open[g].members.empty()) out.push_back(std::move(open[g].members));
  }
  return out;
}

std::string orderProblem(const std::vector<int>& order, size_t n, const std::vector<std::string>& names) {
  auto index = [&](size_t i) {
    return names.size() == n ? fmt::format("index {} ('{}')", i, names[i]) : fmt::format("index {}", i);
  };
  std::vector<bool> seen(n, false);
  for (int i : order) {
    if (i < 0 || static_cast<size_t>(i) >= n) return fmt::format("index {} is out of range", i);
    if (seen[i]) return index(i) + " appears twice";
    seen[i] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen[i]) return index(i) + " is missing";
  }
  return "";
}

}  // namespace tessera::ddp
