#include "sharding/fsdp/unit.h"

#include "common/error.h"

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

}  // namespace tessera
