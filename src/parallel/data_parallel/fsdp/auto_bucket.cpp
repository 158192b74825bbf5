#include "tessera/parallel/data_parallel/fsdp/unit.h"

#include "tessera/common/error.h"

#include <algorithm>

namespace tessera {

std::vector<FsdpUnitSpec> autoBucketUnits(const std::vector<NamedModule>& modules, size_t minUnitBytes) {
  std::vector<FsdpUnitSpec> units;
  FsdpUnitSpec cur;
  size_t bytes = 0;
  std::string first, last;
  auto close = [&] {
    if (cur.modules.empty()) return;
    cur.name = first == last ? first : first + ".." + last;
    units.push_back(std::move(cur));
    cur = FsdpUnitSpec{};
    bytes = 0;
  };
  for (size_t m = 0; m < modules.size(); ++m) {
    const auto& [name, mod] = modules[m];
    TESSERA_CHECK(mod != nullptr, "autoBucketUnits: module {} ('{}') is null", m, name);
    if (cur.modules.empty()) first = name;
    last = name;
    cur.modules.push_back(m);
    for (const auto& p : mod->named_parameters(true)) {
      cur.params.emplace_back(name + "." + p.key(), p.value());
      bytes += static_cast<size_t>(p.value().numel()) * p.value().element_size();
    }
    if (bytes >= minUnitBytes) close();
  }
  close();
  return units;
}

size_t autoPrefetchBudget(const std::vector<FsdpUnitSpec>& units, c10::ScalarType paramDtype, bool reshardByDefault) {
  size_t pinned = 0;
  std::vector<size_t> others;
  for (const auto& u : units) {
    size_t b = 0;
    for (const auto& np : u.params) b += static_cast<size_t>(np.second.numel()) * c10::elementSize(paramDtype);
    if (u.reshardAfterForward.value_or(reshardByDefault)) {
      others.push_back(b);
    } else {
      pinned += b;
    }
  }
  size_t ahead = 512u << 20;
  if (!others.empty()) {
    const size_t largest = *std::max_element(others.begin(), others.end());
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    const size_t median = others[others.size() / 2];
    ahead = std::max<size_t>({ahead, 2 * median, largest + median});
  }
  return pinned + ahead;
}

}  // namespace tessera
