#pragma once
// What the caller gives FSDP: units (a name and the parameters the unit's forward uses), either
// listed explicitly (e.g. one per transformer block plus a root unit for embeddings and head)
// or formed by auto-bucketing consecutive modules up to a byte budget.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct FsdpUnitSpec {
  std::string name;
  // (name, parameter): leaf tensors of one device. A tensor listed twice in one unit is kept
  // once (first name); a tensor in two units is refused (tessera::Error naming both).
  std::vector<std::pair<std::string, at::Tensor>> params;
  // Overrides FsdpOptions::reshardAfterForward for this unit (e.g. false for the root unit,
  // whose parameters are used at both ends of the model's forward).
  std::optional<bool> reshardAfterForward;
  // Indices into the module list given to autoBucketUnits (empty for explicit units).
  std::vector<size_t> modules;
};

using NamedModule = std::pair<std::string, std::shared_ptr<torch::nn::Module>>;

// Local. Groups consecutive `modules` into units: a unit takes modules until its parameter
// bytes (in the parameters' current dtype) reach `minUnitBytes`, then the next unit starts;
// the last unit takes what is left. Parameter names are "<module name>.<parameter name>";
// the unit's name is "<first module>..<last module>" (or the module's name). A parameter
// appearing in two modules is kept in the first unit that has it and refused by FSDP if the
// two modules land in different units. minUnitBytes == 0 puts every module in its own unit.
std::vector<FsdpUnitSpec> autoBucketUnits(const std::vector<NamedModule>& modules, size_t minUnitBytes);

// Local. A prefetch budget (FsdpOptions::prefetchBudgetBytes, bytes of `paramDtype`) that lets
// every unit's all-gather run beside the compute of the unit before it: the units kept gathered
// through forward (reshardAfterForward false: they count against the budget while alive), plus
// the largest of 512 MiB, two median units, and the largest other unit beside a median one.
// `reshardByDefault` stands for FsdpOptions::reshardAfterForward (units that do not override it).
size_t autoPrefetchBudget(const std::vector<FsdpUnitSpec>& units, c10::ScalarType paramDtype,
                          bool reshardByDefault = true);

}  // namespace tessera
