#include "sharding/fsdp/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "common/error.h"
#include "common/log.h"
#include "kernels/bucket_copy.h"
#include "parallel/ddp/param_sync.h"
#include "sharding/fsdp/hooks.h"
#include "sharding/fsdp/prefetch.h"
#include "sharding/fsdp/unit_state.h"

namespace tessera {
namespace fsdp {
// Adds the unit's (completed) reduce-scatter output into its fp32 grad shard, taking the output
// itself as the shard when there is none yet (the first backward after zeroGrad).
void addIntoGrad(Unit& x) {
  torch::NoGradGuard ng;
  adoptViewGrads(x);
  auto out = x.rsOut.to(at::kFloat);
  if (x.grad.defined()) {
    x.grad.add_(out);
  } else {
    x.grad = out;  // rsOut itself (fp32), or its fresh fp32 copy
  }
  x.rsOut = at::Tensor();
  publishViewGrads(x);
}
}  // namespace fsdp


using fsdp::Unit;

namespace {

// Splits `world` for hybrid sharding: shard groups of `s` consecutive ranks, replica groups
// of ranks with the same position in their shard group.
void makeGroups(const CommPtr& world, int s, CommPtr& shard, CommPtr& replica) {
  const int n = world->size(), r = world->rank();
  if (s == 0 || s == n) {
    shard = world;
    return;
  }
  TESSERA_CHECK(s > 0 && n % s == 0,
                "FullyShardedDataParallel: shardGroupSize {} does not divide the world size {} of group '{}'", s, n,
                world->name());
  shard = world->split(r / s, r, fmt::format("{}.fsdp_shard{}", world->name(), r / s));
  replica = world->split(r % s, r, fmt::format("{}.fsdp_replica{}", world->name(), r % s));
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::vector<FsdpUnitSpec> specs, CommPtr comm, FsdpOptions o)
    : world_(std::move(comm)), opts_(o) {
  TESSERA_CHECK(world_ != nullptr, "FullyShardedDataParallel: null communicator");
  TESSERA_CHECK(!specs.empty(), "FullyShardedDataParallel: no units (rank {})", world_->rank());
  TESSERA_CHECK(isFloatingDtype(o.paramDtype) && isFloatingDtype(o.reduceDtype),
                "FullyShardedDataParallel: paramDtype {} / reduceDtype {} must be float32, bfloat16 or float16",
                dtypeName(o.paramDtype), dtypeName(o.reduceDtype));

  // Ownership checks: a tensor in two units is refused; within a unit it is kept once.
  std::unordered_map<const void*, std::pair<std::string, std::string>> owner;  // impl -> (unit, param)
  std::unordered_map<std::string, std::string> nameUnit;                        // param name -> unit
  Named all;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> kept(specs.size());
  for (size_t u = 0; u < specs.size(); ++u) {
    const auto& s = specs[u];
    TESSERA_CHECK(!s.params.empty(), "FullyShardedDataParallel: unit {} ('{}') has no parameters", u, s.name);
    for (const auto& [name, t] : s.params) {
      TESSERA_CHECK(t.defined(), "FullyShardedDataParallel: parameter '{}' of unit '{}' is undefined", name, s.name);
      const void* key = t.unsafeGetTensorImpl();
      auto it = owner.find(key);
      if (it != owner.end()) {
        TESSERA_CHECK(it->second.first == s.name,
                      "FullyShardedDataParallel: parameter '{}' of unit '{}' is the same tensor as '{}' of unit '{}': "
                      "a parameter shared across units is not supported; put the modules sharing it in one unit",
                      name, s.name, it->second.second, it->second.first);
        continue;
      }
      owner[key] = {s.name, name};
      auto [nu, fresh] = nameUnit.emplace(name, s.name);
      TESSERA_CHECK(fresh, "FullyShardedDataParallel: parameter name '{}' appears in unit '{}' and in unit '{}' (names "
                    "key the state dicts and must be unique)",
                    name, nu->second, s.name);
      TESSERA_CHECK(t.is_leaf(), "FullyShardedDataParallel: parameter '{}' of unit '{}' is not a leaf tensor", name,
                    s.name);
      TESSERA_CHECK(isFloatingDtype(t.scalar_type()),
                    "FullyShardedDataParallel: parameter '{}' of unit '{}' has dtype {}; float32, bfloat16 or float16 "
                    "expected",
                    name, s.name, dtypeName(t.scalar_type()));
      TESSERA_CHECK(t.device() == s.params[0].second.device(),
                    "FullyShardedDataParallel: parameter '{}' is on {}, '{}' on {}", name, t.device().str(),
                    s.params[0].first, s.params[0].second.device().str());
      kept[u].emplace_back(name, t);
      all.emplace_back(s.name + "/" + name, t);
    }
  }
  if (opts_.syncModuleStates) {
    torch::NoGradGuard ng;
    ddp::checkSameParameters(*world_, all, all.front().second.options());
    std::vector<at::Tensor> ts;
    for (auto& [n, t] : all) ts.push_back(t);
    ddp::broadcastTensors(*world_, ts, 0);
  }
  makeGroups(world_, opts_.shardGroupSize, shardComm_, replicaComm_);
  const int shards = shardComm_->size(), srank = shardComm_->rank();

  for (size_t u = 0; u < specs.size(); ++u) {
    auto x = std::make_unique<Unit>();
    x->name = specs[u].name;
    x->reshardAfterForward = specs[u].reshardAfterForward.value_or(opts_.reshardAfterForward);
    for (auto& [n, t] : kept[u]) {
      x->names.push_back(n);
      x->params.push_back(t);
    }
    x->layout = fsdp::makeLayout(x->names, x->params, shards);
    const auto& l = x->layout;
    const auto dev = x->params[0].device();
    auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
    {
      torch::NoGradGuard ng;
      auto flat = at::zeros({l.paddedNumel}, f32);
      std::vector<at::Tensor> srcs;
      std::vector<int64_t> offs;
      for (const auto& e : l.entries) {
        srcs.push_back(x->params[e.index].detach().contiguous());
        offs.push_back(e.offset);
      }
      kernels::flattenScaleCast(srcs, flat, offs, 1.0);
      x->master = flat.narrow(0, static_cast<int64_t>(srank) * l.shardNumel, l.shardNumel).clone();
      // x->grad stays undefined until a backward produces it (zeroGrad releases it again).
      x->full = at::empty({l.paddedNumel}, f32.dtype(opts_.paramDtype));
      // Parameters become views of the unsharded buffer (their own storage is dropped).
      for (const auto& e : l.entries) {
        x->params[e.index].set_data(x->full.narrow(0, e.offset, e.numel).view(e.shape));
      }
    }
    x->gotGrad.assign(x->params.size(), false);
    for (const auto& e : l.entries) {
      if (!e.trainable) {
        x->hasFrozen = true;
        continue;
      }
      ++x->trainable;
      x->hooks.push_back(fsdp::addGradReadyHook(*this, static_cast<int>(u), e.index, x->params[e.index], e.name));
    }
    fsdp::freeStorage(x->full);
    unitBytes_.push_back(static_cast<size_t>(l.paddedNumel) * x->full.element_size());
    units_.push_back(std::move(x));
  }
  alive_.assign(units_.size(), false);
  resetPass();
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (auto& x : units_) {
    for (auto& [acc, key] : x->hooks) acc->del_post_hook(key);
  }
}

size_t FullyShardedDataParallel::numUnits() const { return units_.size(); }
const std::string& FullyShardedDataParallel::unitName(size_t u) const { return units_.at(u)->name; }
const fsdp::FlatLayout& FullyShardedDataParallel::layout(size_t u) const { return units_.at(u)->layout; }
at::Tensor FullyShardedDataParallel::masterShard(size_t u) const { return units_.at(u)->master; }
at::Tensor FullyShardedDataParallel::gradShard(size_t u) const {
  auto& x = *units_.at(u);
  fsdp::adoptViewGrads(x);
  return x.grad.defined() ? x.grad : at::zeros({x.layout.shardNumel}, x.master.options());
}
int FullyShardedDataParallel::shardRank() const { return shardComm_->rank(); }

void FullyShardedDataParallel::resetStats() {
  stats_.peakUnshardedUnits = stats_.unshardedUnits;
  stats_.peakUnshardedBytes = stats_.unshardedBytes;
  stats_.allGathers = stats_.prefetches = stats_.reduceScatters = 0;
}

bool FullyShardedDataParallel::reshardsAfterForward(int u) const { return units_[u]->reshardAfterForward; }

// ---- gather / reshard

void FullyShardedDataParallel::gather(int u, bool prefetch) {
  auto& x = *units_[u];
  if (x.state != Unit::State::Sharded) return;
  fsdp::allocateStorage(x.full, unitBytes_[u]);
  {
    torch::NoGradGuard ng;
    x.gatherIn = opts_.paramDtype == at::kFloat ? x.master : x.master.to(opts_.paramDtype);
    if (shardComm_->size() == 1) {
      x.full.copy_(x.gatherIn);
    } else {
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

void FullyShardedDataParallel::waitGathered(int u) {
  auto& x = *units_[u];
  if (x.state != Unit::State::Gathering) return;
  if (x.gatherWork) x.gatherWork->wait();
  x.gatherWork.reset();
  x.gatherIn = at::Tensor();
  x.state = Unit::State::Unsharded;
}

void FullyShardedDataParallel::reshard(int u) {
  auto& x = *units_[u];
  if (x.state == Unit::State::Sharded) return;
  waitGathered(u);  // the communicator must be done writing before the memory goes
  fsdp::freeStorage(x.full);
  x.state = Unit::State::Sharded;
  alive_[u] = false;
  stats_.unshardedUnits -= 1;
  stats_.unshardedBytes -= unitBytes_[u];
}

void FullyShardedDataParallel::reshardAll() {
  for (size_t u = 0; u < units_.size(); ++u) reshard(static_cast<int>(u));
  if (!inBackward_) passOpen_ = false;  // e.g. after an eval forward: the next run starts a pass
}

void FullyShardedDataParallel::unshardAll() {
  TESSERA_CHECK(!passOpen_ && !inBackward_ && running_ < 0,
                "FullyShardedDataParallel::unshardAll: called inside a forward/backward pass");
  for (size_t u = 0; u < units_.size(); ++u) gather(static_cast<int>(u), false);
  for (size_t u = 0; u < units_.size(); ++u) waitGathered(static_cast<int>(u));
}

void FullyShardedDataParallel::prefetchAfter(const std::vector<int>& order, int u) {
  fsdp::PrefetchPlanner planner(opts_.prefetchBudgetBytes);
  for (int p : planner.pick(order, u, unitBytes_, alive_, stats_.unshardedBytes)) gather(p, true);
}

// ---- forward

at::Tensor FullyShardedDataParallel::runUnit(size_t unit, const at::Tensor& input, const Fn& fn) {
  auto out = runUnit(unit, std::vector<at::Tensor>{input},
                     [&fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; });
  return out[0];
}

std::vector<at::Tensor> FullyShardedDataParallel::runUnit(size_t unit, const std::vector<at::Tensor>& inputs,
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
  if (reshardsAfterForward(u)) reshard(u);
  return outs;
}

// ---- backward

// A unit that ran more often in the forward a backward goes through than another unit (a root
// holding the embedding and the head, run at both ends of the forward) while resharding after
// forward was all-gathered for each run; its backward then keeps it gathered from its first
// pre-backward hook to its last gradient anyway. Counted by pre-backward hooks of one backward,
// so forwards of micro-batches whose backwards come later (pipelines: F0 F1 B0, interleaved
// stages) do not count as repeats. Warned once per unit.
void FullyShardedDataParallel::warnRepeatedRuns() {
  int fewest = 0;
  for (const auto& x : units_) {
    if (x->bwdRuns > 0) fewest = fewest == 0 ? x->bwdRuns : std::min(fewest, x->bwdRuns);
  }
  for (size_t v = 0; v < units_.size(); ++v) {
    auto& x = *units_[v];
    if (!x.reshardAfterForward || x.warnedRerun || x.bwdRuns <= fewest) continue;
    x.warnedRerun = true;
    log::warn("FullyShardedDataParallel: unit {} ('{}') ran {} times in the forward this backward went through, more "
              "often than other units ({}), with reshardAfterForward true: it is all-gathered again for every run. "
              "Give it reshardAfterForward = false (FsdpUnitSpec; as the Python wrapper does for its root unit) to "
              "gather it once per forward. (Warned once per unit.)",
              v, x.name, x.bwdRuns, fewest);
  }
}

void FullyShardedDataParallel::beginBackward() {
  if (inBackward_) return;
  inBackward_ = true;
  backwardOrder_.assign(passOrder_.rbegin(), passOrder_.rend());
  nextLaunch_ = 0;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalizeBackward(); });
}

void FullyShardedDataParallel::onPreBackward(int u) {
  beginBackward();
  auto& x = *units_[u];
  x.ranWithGrad = true;
  x.liveGraphs = std::max(0, x.liveGraphs - 1);
  x.bwdRuns += 1;
  gather(u, false);
  if (!x.bwdPrefetched) prefetchAfter(backwardOrder_, u);  // once per unit and backward
  x.bwdPrefetched = true;
  waitGathered(u);
}

void FullyShardedDataParallel::onGradReady(int u, int param) {
  beginBackward();
  auto& x = *units_[u];
  TESSERA_CHECK(!x.gotGrad[param],
                "FullyShardedDataParallel: parameter '{}' of unit '{}' got its gradient twice in one backward on rank "
                "{} (reentrant backward or retain_graph re-run?)",
                x.names[param], x.name, world_->rank());
  x.gotGrad[param] = true;
  if (--x.pending == 0) {
    x.gradsReady = true;
    launchReady();
  }
}

void FullyShardedDataParallel::launchReady() {
  while (nextLaunch_ < backwardOrder_.size()) {
    const int u = backwardOrder_[nextLaunch_];
    auto& x = *units_[u];
    if (x.trainable > 0 && x.ranWithGrad && !x.gradsReady) break;
    ++nextLaunch_;
    if (x.trainable > 0 && x.ranWithGrad) processGrads(u);
  }
}

void FullyShardedDataParallel::processGrads(int u) {
  auto& x = *units_[u];
  const auto& l = x.layout;
  x.launched = true;
  torch::NoGradGuard ng;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> offs;
  for (const auto& e : l.entries) {
    if (!e.trainable) continue;
    auto& p = x.params[e.index];
    const auto& g = p.grad();
    if (g.defined()) {
      grads.push_back(g.is_contiguous() ? g : g.contiguous());
      offs.push_back(e.offset);
    }
  }
  auto f32 = x.master.options();
  const double scale = 1.0 / world_->size();
  if (!sync_) {
    auto flat = at::zeros({l.paddedNumel}, f32);
    kernels::flattenScaleCast(grads, flat, offs, 1.0);
    if (x.accum.defined()) {
      x.accum.add_(flat);
    } else {
      x.accum = flat;
    }
  } else {
    releaseReduceInput();  // its memory goes to this unit's input, stream-ordered
    at::Tensor flat;
    if (x.accum.defined()) {
      auto f = at::zeros({l.paddedNumel}, f32);
      kernels::flattenScaleCast(grads, f, offs, 1.0);
      flat = f.add_(x.accum).mul_(scale).to(opts_.reduceDtype);
      x.accum = at::Tensor();
    } else {
      flat = at::zeros({l.paddedNumel}, f32.dtype(opts_.reduceDtype));
      kernels::flattenScaleCast(grads, flat, offs, scale);
    }
    x.rsOut = at::empty({l.shardNumel}, f32.dtype(opts_.reduceDtype));
    if (shardComm_->size() == 1) {
      x.rsOut.copy_(flat);
    } else {
      x.rsWork = shardComm_->reduceScatter(x.rsOut, flat, ReduceOp::Sum, Keep::ByCaller);
      reduceIn_ = flat;
      reduceInWork_ = x.rsWork;
    }
    stats_.reduceScatters += 1;
    if (!replicaComm_) drainReduceScatters(u);
  }
  for (auto& p : x.params) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  if (!x.hasFrozen) reshard(u);
}

// Frees the last reduce-scatter's input once the current stream has waited for that op (no host
// wait): the caching allocator then hands its block to the next allocation on this stream.
void FullyShardedDataParallel::releaseReduceInput() {
  if (reduceInWork_) reduceInWork_->wait();
  reduceInWork_.reset();
  reduceIn_ = at::Tensor();
}

// Adds the reduce-scatter outputs of units launched before `current` into their grad shards as
// soon as they are complete (no host wait), and waits (stream-ordered) for all but the newest
// kMaxUndrained, so at most that many fp32 output shards are alive at once instead of one per
// unit until the end of backward. Plain FSDP only: hybrid sharding all-reduces the outputs
// across replicas first, in finalizeBackward.
void FullyShardedDataParallel::drainReduceScatters(int current) {
  constexpr int kMaxUndrained = 2;
  std::vector<int> open;
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (u != current && x.launched && x.rsOut.defined()) open.push_back(u);
  }
  for (size_t i = 0; i < open.size(); ++i) {
    auto& x = *units_[open[i]];
    const bool mustWait = static_cast<int>(open.size() - i) > kMaxUndrained;
    if (x.rsWork && !mustWait && !x.rsWork->completed()) continue;
    if (x.rsWork) x.rsWork->wait();
    fsdp::addIntoGrad(x);
    x.rsWork.reset();
  }
}

void FullyShardedDataParallel::finalizeBackward() {
  // Units whose trainable parameters did not all get a gradient: launch now (zeros for those).
  for (int u : backwardOrder_) units_[u]->gradsReady = true;
  launchReady();
  std::vector<WorkPtr> replicaWorks;
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (!x.launched || !sync_ || !x.rsOut.defined()) continue;  // undefined: drained during backward
    if (x.rsWork) x.rsWork->wait();
    if (replicaComm_) replicaWorks.push_back(replicaComm_->allReduce(x.rsOut, ReduceOp::Sum));
  }
  for (auto& w : replicaWorks) w->wait();
  releaseReduceInput();
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (x.launched && sync_ && x.rsOut.defined()) fsdp::addIntoGrad(x);  // addIntoGrad runs without grad mode
  }
  reshardAll();
  warnRepeatedRuns();
  plannedOrder_ = passOrder_;
  resetPass();
}

void FullyShardedDataParallel::resetPass() {
  for (auto& x : units_) {
    x->ranWithGrad = x->liveGraphs > 0;  // forwards whose backward is still to come
    x->bwdPrefetched = false;
    x->bwdRuns = 0;
    std::fill(x->gotGrad.begin(), x->gotGrad.end(), false);
    x->pending = x->trainable;
    x->gradsReady = x->launched = false;
    x->rsWork.reset();
    x->rsOut = at::Tensor();
  }
  inBackward_ = false;
  passOpen_ = false;
  nextLaunch_ = 0;
}

// ---- gradients

FullyShardedDataParallel::NoSync::NoSync(FullyShardedDataParallel& f) : f_(f), prev_(f.sync_) { f_.sync_ = false; }
FullyShardedDataParallel::NoSync::~NoSync() { f_.sync_ = prev_; }

void FullyShardedDataParallel::zeroGrad() {
  for (auto& x : units_) {
    x->grad = at::Tensor();  // released, as zero_grad(set_to_none=True): no memory until the next backward
    x->accum = at::Tensor();
    fsdp::publishViewGrads(*x);
  }
}

at::Tensor FullyShardedDataParallel::clipGradNorm(double maxNorm) {
  TESSERA_CHECK(maxNorm >= 0, "FullyShardedDataParallel::clipGradNorm: maxNorm {} must be >= 0", maxNorm);
  torch::NoGradGuard ng;
  const int r = shardComm_->rank();
  auto sq = at::zeros({1}, units_[0]->master.options());
  for (auto& x : units_) {
    fsdp::adoptViewGrads(*x);
    if (!x->grad.defined()) continue;  // no gradient since zeroGrad: zeros
    auto g = x->grad.narrow(0, 0, x->layout.trainableInShard(r));
    sq.add_(g.pow(2).sum());
  }
  // Replicas hold the same shards: the shard group covers the whole model once. wait() orders
  // the current stream after the sum on CUDA (no host sync); on the CPU it blocks, as any op.
  if (shardComm_->size() > 1) shardComm_->allReduce(sq, ReduceOp::Sum)->wait();
  auto norm = sq.sqrt();
  // min(1, c) on the device, every shard multiplied by it: x 1 leaves a value unchanged.
  auto coef = (maxNorm / (norm + 1e-6)).clamp_max(1.0);
  for (auto& x : units_) {
    if (x->grad.defined()) x->grad.mul_(coef);
  }
  return norm.reshape({});
}

}  // namespace tessera
