#pragma once
// Memory-budgeted prefetch planning (pure logic, no communication; tested without ranks).
//
// FSDP knows the order in which units run (forward: the order of the previous iteration's
// first runs; backward: the reverse of this iteration's). When unit `current` is needed, the
// planner names the units to all-gather ahead of time: the next units in `order` after
// `current`, in order, skipping units already unsharded (or being gathered), and stopping at
// the first one that would bring the bytes of unsharded parameters alive (gathered, being
// gathered, or needed now) above `budgetBytes`. A budget of 0 never prefetches; the unit
// needed now is gathered whatever the budget, so the bytes alive stay at most
// max(budget, bytes of the units the computation needs at once) as long as units run in the
// planned order (FSDP prefetches once per unit and pass: in forward on the unit's first run,
// in backward on its first pre-backward hook).
#include <cstddef>
#include <vector>

namespace tessera::fsdp {

class PrefetchPlanner {
 public:
  explicit PrefetchPlanner(size_t budgetBytes) : budget_(budgetBytes) {}
  size_t budget() const { return budget_; }

  // bytes[u]: unsharded size of unit u; alive[u]: unit u is unsharded or being gathered;
  // aliveBytes: sum of bytes over alive units (including `current`). Returns units to gather,
  // in the order to issue them.
  std::vector<int> pick(const std::vector<int>& order, int current, const std::vector<size_t>& bytes,
                        const std::vector<bool>& alive, size_t aliveBytes) const;

 private:
  size_t budget_;
};

}  // namespace tessera::fsdp
