// FullyShardedDataParallel: gathering and resharding units, prefetch, and runUnit (the forward;
// contract in fsdp.h).
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "parallel/data_parallel/fsdp/hooks.h"
#include "parallel/data_parallel/fsdp/prefetch.h"
#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"

namespace tessera {

using fsdp::Unit;

// ---- gather / reshard

void FullyShardedDataParallel::Impl::gather(int u, bool prefetch) {
  auto& x = *units_[u];
  if (x.state != Unit::State::Sharded) return;
  fsdp::allocateStorage(x.full, unitBytes_[u]);
  {
    torch::NoGradGuard ng;
    if (shardComm_->size() == 1) {
      // The cast in the copy: no second copy of the whole unit kept until it runs (gatherIn would be
      // the whole unit in paramDtype beside x.full, twice a prefetched unit's planned bytes).
      x.full.copy_(x.master);
    } else {
      x.gatherIn = opts_.paramDtype == at::kFloat ? x.master : x.master.to(opts_.paramDtype);
      x.gatherWork = shardComm_->allGather(x.full, x.gatherIn, Keep::ByCaller);
    }
  }
  x.state = Unit::State::Gathering;
  alive_[u] = true;
  stats_.unshardedUnits += 1;
  stats_.unshardedBytes += unitBytes_[u];
  stats_.peakUnshardedUnits = std::max(stats_.peakUnshardedUnits, stats_.unshardedUnits);
  stats_.peakUnshardedBytes = std::max(stats_.peakUnshardedBytes, stats_.unshardedBytes);
  stats_.allGathers += 1;
  if (prefetch) stats_.prefetches += 1;
}

void FullyShardedDataParallel::Impl::waitGathered(int u) {
  auto& x = *units_[u];
  if (x.state != Unit::State::Gathering) return;
  if (x.gatherWork) x.gatherWork->wait();
  x.gatherWork.reset();
  x.gatherIn = at::Tensor();
  x.state = Unit::State::Unsharded;
}

void FullyShardedDataParallel::Impl::reshard(int u) {
  auto& x = *units_[u];
  if (x.state == Unit::State::Sharded) return;
  waitGathered(u);  // the communicator must be done writing before the memory goes
  fsdp::freeStorage(x.full);
  x.state = Unit::State::Sharded;
  x.gatheredAhead = false;
  x.kept = false;
  alive_[u] = false;
  stats_.unshardedUnits -= 1;
  stats_.unshardedBytes -= unitBytes_[u];
}

void FullyShardedDataParallel::Impl::keepOrReshard(int u) {
  if (keep_) {
    units_[u]->kept = units_[u]->state != Unit::State::Sharded;
  } else {
    reshard(u);
  }
}

void FullyShardedDataParallel::Impl::reshardAll() {
  for (size_t u = 0; u < units_.size(); ++u) reshard(static_cast<int>(u));
  if (!inBackward_) passOpen_ = false;  // e.g. after an eval forward: the next run starts a pass
}

void FullyShardedDataParallel::Impl::endKeep() {
  keep_ = false;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->kept) reshard(static_cast<int>(u));  // clears kept
  }
}

void FullyShardedDataParallel::Impl::unshardAll() {
  TESSERA_CHECK(!passOpen_ && !inBackward_ && running_ < 0,
                "FullyShardedDataParallel::unshardAll: called inside a forward/backward pass");
  for (size_t u = 0; u < units_.size(); ++u) gather(static_cast<int>(u), false);
  for (size_t u = 0; u < units_.size(); ++u) waitGathered(static_cast<int>(u));
}

std::vector<int> FullyShardedDataParallel::Impl::leadingUnits() const {
  if (plannedOrder_.empty() || opts_.prefetchBudgetBytes == 0 || shardComm_->size() == 1) return {};
  const int first = plannedOrder_.front();
  auto alive = alive_;
  size_t bytes = stats_.unshardedBytes;
  if (!alive[first]) alive[first] = true, bytes += unitBytes_[first];
  std::vector<int> out{first};
  for (int p : fsdp::PrefetchPlanner(opts_.prefetchBudgetBytes).pick(plannedOrder_, first, unitBytes_, alive, bytes)) {
    out.push_back(p);
  }
  return out;
}

void FullyShardedDataParallel::Impl::gatherForNextForward(const std::vector<int>& units) {
  TESSERA_CHECK(!passOpen_ && !inBackward_ && running_ < 0,
                "FullyShardedDataParallel::gatherForNextForward: called inside a forward/backward pass");
  for (int u : units) {
    TESSERA_CHECK(u >= 0 && static_cast<size_t>(u) < units_.size(),
                  "FullyShardedDataParallel::gatherForNextForward: unit {} out of range (there are {} units)", u,
                  units_.size());
    if (units_[u]->state != Unit::State::Sharded) continue;
    gather(u, true);
    units_[u]->gatheredAhead = true;
  }
}

void FullyShardedDataParallel::Impl::prefetchAfter(const std::vector<int>& order, int u) {
  if (shardComm_->size() == 1) return;  // nothing to hide (fsdp.h, prefetchBudgetBytes)
  size_t alive = stats_.unshardedBytes;  // kept units (KeepGathered) are outside the budget
  for (size_t v = 0; v < units_.size(); ++v) {
    if (units_[v]->kept && static_cast<int>(v) != u) alive -= unitBytes_[v];
  }
  fsdp::PrefetchPlanner planner(opts_.prefetchBudgetBytes);
  for (int p : planner.pick(order, u, unitBytes_, alive_, alive)) gather(p, true);
}

// ---- forward

std::vector<at::Tensor> FullyShardedDataParallel::Impl::runUnit(size_t unit, const std::vector<at::Tensor>& inputs,
                                                          const MultiFn& fn) {
  TESSERA_CHECK(unit < units_.size(), "FullyShardedDataParallel::runUnit: unit {} out of range (there are {} units)",
                unit, units_.size());
  const int u = static_cast<int>(unit);
  // Units nest only inside a unit that stays gathered through forward (reshardAfterForward
  // false, e.g. a root unit wrapping the whole model's forward).
  TESSERA_CHECK(running_ < 0 || !reshardsAfterForward(running_),
                "FullyShardedDataParallel::runUnit: unit {} ('{}') started while unit {} ('{}') runs; units nest "
                "only inside a unit with reshardAfterForward false",
                u, units_[u]->name, running_, running_ >= 0 ? units_[running_]->name : "");
  TESSERA_CHECK(running_ != u, "FullyShardedDataParallel::runUnit: unit {} ('{}') started inside itself", u,
                units_[u]->name);
  TESSERA_CHECK(!inBackward_, "FullyShardedDataParallel::runUnit: unit {} ('{}') run during backward (activation "
                "recomputation inside FSDP units is not supported)",
                u, units_[u]->name);
  if (!passOpen_) {  // first unit of an iteration
    passOpen_ = true;
    passOrder_.clear();
  }
  // Prefetch on a unit's first run of the pass only: a later run (the root's head after the
  // last block) must not gather the next iteration's first units now.
  const bool first = std::find(passOrder_.begin(), passOrder_.end(), u) == passOrder_.end();
  if (first) passOrder_.push_back(u);
  units_[u]->gatheredAhead = false;  // a forward uses it now: resharded as usual from here

  gather(u, false);
  if (first) prefetchAfter(plannedOrder_, u);
  waitGathered(u);
  std::vector<at::Tensor> outs;
  const int outer = running_;
  running_ = u;
  try {
    outs = fn(inputs);
  } catch (const c10::Error& e) {
    running_ = outer;
    // ATen's words for a tensor whose storage FSDP released (reading it: "data is not allocated";
    // viewing it, as linear's weight.t(): "out of bounds for storage of size 0"): most likely a
    // parameter of another unit, sharded now. Say so, naming the units (checking each op's
    // tensors would cost time).
    const std::string what = e.what_without_backtrace();
    std::vector<std::string> sharded;
    for (const auto& x : units_) {
      if (x->state == Unit::State::Sharded) sharded.push_back("'" + x->name + "'");
    }
    const bool released = what.find("data is not allocated") != std::string::npos ||
                          what.find("out of bounds for storage of size 0") != std::string::npos;
    if (!released || sharded.empty()) throw;
    throw Error(fmt::format(
        "FullyShardedDataParallel::runUnit: the forward of unit {} ('{}') used a tensor whose memory is released, "
        "most likely a parameter of a unit that is sharded now ({}): a unit's forward may use only its own "
        "parameters and those of an enclosing unit with reshardAfterForward false (put modules sharing parameters "
        "in one unit). ATen said: {}",
        u, units_[u]->name, fmt::join(sharded, ", "), what.substr(0, what.find('\n'))));
  } catch (...) {
    running_ = outer;
    throw;
  }
  running_ = outer;
  if (at::GradMode::is_enabled()) {
    bool anyGrad = false;
    for (const auto& t : outs) anyGrad = anyGrad || (t.defined() && t.requires_grad());
    if (anyGrad) {
      units_[u]->ranWithGrad = true;
      units_[u]->liveGraphs += 1;
      outs = fsdp::attachPreBackward(*this, u, outs);
    }
  }
  if (reshardsAfterForward(u)) keepOrReshard(u);
  return outs;
}

}  // namespace tessera
