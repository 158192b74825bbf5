#include "parallel/ddp/buckets.h"

#include <map>

namespace tessera::ddp {

std::vector<std::vector<int>> assignBuckets(const std::vector<int>& order, const std::vector<BucketParam>& params,
                                            size_t cap, size_t firstCap) {
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

}  // namespace tessera::ddp
