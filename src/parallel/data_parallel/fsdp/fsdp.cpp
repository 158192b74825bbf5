// FullyShardedDataParallel: construction (agree, flatten, shard, broadcast), accessors and the
// gradient shards' zeroing and clipping (contract in fsdp.h; forward in gather.cpp, backward in
// backward.cpp).
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "kernels/bucket_copy.h"
#include "parallel/data_parallel/ddp/param_sync.h"
#include "parallel/data_parallel/fsdp/hooks.h"
#include "parallel/data_parallel/fsdp/prefetch.h"
#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"

namespace tessera {

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

// Every unit's parameters, checked (defined, leaf, floating, one device per unit; a tensor in two
// units refused, kept once within one; names unique); `all` gets them as "<unit>/<name>".
std::vector<std::vector<std::pair<std::string, at::Tensor>>> checkedParams(const std::vector<FsdpUnitSpec>& specs,
                                                                           FullyShardedDataParallel::Named& all) {
  std::unordered_map<const void*, std::pair<std::string, std::string>> owner;  // impl -> (unit, param)
  std::unordered_map<std::string, std::string> nameUnit;                        // param name -> unit
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
  return kept;
}

}  // namespace

FullyShardedDataParallel::Impl::Impl(std::vector<FsdpUnitSpec> specs, CommPtr comm, FsdpOptions o)
    : world_(std::move(comm)), opts_(o) {
  TESSERA_CHECK(world_ != nullptr, "FullyShardedDataParallel: null communicator");
  TESSERA_CHECK(!specs.empty(), "FullyShardedDataParallel: no units (rank {})", world_->rank());
  TESSERA_CHECK(isFloatingDtype(o.paramDtype) && isFloatingDtype(o.reduceDtype),
                "FullyShardedDataParallel: paramDtype {} / reduceDtype {} must be float32, bfloat16 or float16",
                dtypeName(o.paramDtype), dtypeName(o.reduceDtype));

  Named all;
  const auto kept = checkedParams(specs, all);
  if (opts_.syncModuleStates) {
    torch::NoGradGuard ng;
    ddp::checkSameParameters(*world_, all, all.front().second.options());
    std::vector<at::Tensor> ts;
    for (auto& [n, t] : all) ts.push_back(t);
    ddp::broadcastTensors(*world_, ts, 0);
  }
  makeGroups(world_, opts_.shardGroupSize, shardComm_, replicaComm_);

  for (size_t u = 0; u < specs.size(); ++u) units_.push_back(makeUnit(specs[u], kept[u], static_cast<int>(u)));
  for (const auto& x : units_) unitBytes_.push_back(static_cast<size_t>(x->layout.paddedNumel) * x->full.element_size());
  alive_.assign(units_.size(), false);
  resetPass();
  if (opts_.gatherEmbeddingRows) installRowSinks();
  if (opts_.accumulateGradInGemm) installGradSinks();
}

std::unique_ptr<Unit> FullyShardedDataParallel::Impl::makeUnit(const FsdpUnitSpec& spec,
                                                               const std::vector<std::pair<std::string, at::Tensor>>& params,
                                                               int u) {
  const int shards = shardComm_->size(), srank = shardComm_->rank();
  auto x = std::make_unique<Unit>();
  x->name = spec.name;
  x->reshardAfterForward = spec.reshardAfterForward.value_or(opts_.reshardAfterForward);
  for (const auto& [n, t] : params) {
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
    x->hooks.push_back(fsdp::addGradReadyHook(*this, u, e.index, x->params[e.index], e.name));
  }
  fsdp::freeStorage(x->full);
  return x;
}

FullyShardedDataParallel::Impl::~Impl() {
  removeRowSinks();
  removeGradSinks();
  for (auto& x : units_) {
    for (auto& [acc, key] : x->hooks) acc->del_post_hook(key);
  }
}

at::Tensor FullyShardedDataParallel::Impl::gradShard(size_t u) const {
  auto& x = *units_.at(u);
  fsdp::adoptViewGrads(x);
  return x.grad.defined() ? x.grad : at::zeros({x.layout.shardNumel}, x.master.options());
}
void FullyShardedDataParallel::Impl::resetStats() {
  stats_.peakUnshardedUnits = stats_.unshardedUnits;
  stats_.peakUnshardedBytes = stats_.unshardedBytes;
  stats_.allGathers = stats_.prefetches = stats_.reduceScatters = 0;
}

bool FullyShardedDataParallel::Impl::reshardsAfterForward(int u) const { return units_[u]->reshardAfterForward; }

// ---- gradients

void FullyShardedDataParallel::Impl::zeroGrad() {
  for (auto& x : units_) {
    x->grad = at::Tensor();  // released, as zero_grad(set_to_none=True): no memory until the next backward
    x->accum = at::Tensor();
    fsdp::publishViewGrads(*x);
  }
}

at::Tensor FullyShardedDataParallel::Impl::clipGradNorm(double maxNorm) {
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
