// FullyShardedDataParallel's state dicts (full: gathered to rank 0; sharded: local).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fmt/ranges.h>

#include "tessera/common/error.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"

namespace tessera {

at::Tensor FullyShardedDataParallel::Impl::gatherFull(size_t u, const at::Tensor& shard) const {
  const auto& l = layout(u);
  TESSERA_CHECK(shard.dim() == 1 && shard.numel() <= l.shardNumel,
                "FullyShardedDataParallel::gatherFull: unit {} ('{}') takes a flat shard of at most {} elements, got [{}]",
                u, unitName(u), l.shardNumel, c10::str(shard.sizes()));
  auto out = at::zeros({l.paddedNumel}, shard.options());
  auto mine = at::zeros({l.shardNumel}, shard.options());
  mine.narrow(0, 0, shard.numel()).copy_(shard);
  if (shardComm_->size() == 1) {
    out.copy_(mine);
  } else {
    shardComm_->allGather(out, mine)->wait();
  }
  return out;
}

std::map<std::string, at::Tensor> FullyShardedDataParallel::Impl::fullStateDict() {
  torch::NoGradGuard ng;
  std::map<std::string, at::Tensor> out;
  for (auto& x : units_) {
    const auto& l = x->layout;
    auto full = at::empty({l.paddedNumel}, x->master.options());
    if (shardComm_->size() == 1) {
      full.copy_(x->master);
    } else {
      shardComm_->allGather(full, x->master)->synchronize();
    }
    if (world_->rank() != 0) continue;
    for (const auto& e : l.entries) out[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape).clone();
  }
  return out;
}

// Loading replaces the fp32 master shards only: a gathered unit's parameters (and the graph of a
// forward whose backward is still to come) would go on with the old values.
void FullyShardedDataParallel::Impl::checkLoadable(const char* fn) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    TESSERA_CHECK(units_[u]->state == fsdp::Unit::State::Sharded,
                  "FullyShardedDataParallel::{}: unit {} ('{}') is gathered (after unshardAll, or a forward not "
                  "followed by backward): its parameters would keep the old values; call reshardAll() first",
                  fn, u, units_[u]->name);
  }
  TESSERA_CHECK(!passOpen_ && !inBackward_,
                "FullyShardedDataParallel::{}: called inside a forward/backward pass (a forward whose backward has not "
                "run); finish it or call reshardAll() first",
                fn);
}

// Units gathered ahead for the next forward would keep the old values once a load changes the
// shards: released first (outside a pass; inside one, checkLoadable refuses as before).
void FullyShardedDataParallel::Impl::dropGatheredAhead() {
  if (passOpen_ || inBackward_) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->gatheredAhead) reshard(static_cast<int>(u));
  }
}

void FullyShardedDataParallel::Impl::loadFullStateDict(const std::map<std::string, at::Tensor>& sd) {
  dropGatheredAhead();
  checkLoadable("loadFullStateDict");
  torch::NoGradGuard ng;
  for (auto& x : units_) {
    const auto& l = x->layout;
    auto flat = at::zeros({l.paddedNumel}, x->master.options());
    if (world_->rank() == 0) {
      for (const auto& e : l.entries) {
        auto it = sd.find(e.name);
        TESSERA_CHECK(it != sd.end(), "FullyShardedDataParallel::loadFullStateDict: no entry for parameter '{}' of "
                      "unit '{}'",
                      e.name, x->name);
        TESSERA_CHECK(it->second.sizes().vec() == e.shape,
                      "FullyShardedDataParallel::loadFullStateDict: '{}' has shape {}, the parameter has {}", e.name,
                      fmt::format("{}", fmt::join(it->second.sizes().vec(), "x")),
                      fmt::format("{}", fmt::join(e.shape, "x")));
        flat.narrow(0, e.offset, e.numel).copy_(it->second.reshape({-1}));
      }
    }
    if (world_->size() > 1) world_->broadcast(flat, 0)->synchronize();
    x->master.copy_(flat.narrow(0, static_cast<int64_t>(shardComm_->rank()) * l.shardNumel, l.shardNumel));
  }
}

namespace {
at::Tensor layoutTensor(const fsdp::FlatLayout& l, int rank) {
  return at::tensor(std::vector<int64_t>{l.numel, l.paddedNumel, l.shards, rank}, at::kLong);
}
}  // namespace

std::map<std::string, at::Tensor> FullyShardedDataParallel::Impl::shardedStateDict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& x : units_) {
    out[x->name + ".flat_shard"] = x->master.detach().clone();
    out[x->name + ".layout"] = layoutTensor(x->layout, shardComm_->rank());
  }
  return out;
}

void FullyShardedDataParallel::Impl::loadShardedStateDict(const std::map<std::string, at::Tensor>& sd) {
  dropGatheredAhead();
  checkLoadable("loadShardedStateDict");
  torch::NoGradGuard ng;
  for (auto& x : units_) {
    for (const char* suffix : {".flat_shard", ".layout"}) {
      TESSERA_CHECK(sd.count(x->name + suffix), "FullyShardedDataParallel::loadShardedStateDict: missing key '{}{}'",
                    x->name, suffix);
    }
    auto want = layoutTensor(x->layout, shardComm_->rank());
    auto got = sd.at(x->name + ".layout").to(at::kLong).cpu().contiguous();
    auto vec = [](const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); };
    TESSERA_CHECK(got.numel() == 4 && got.equal(want),
                  "FullyShardedDataParallel::loadShardedStateDict: '{}.layout' is [numel, padded, shards, rank] = [{}], "
                  "this rank has [{}] (a sharded checkpoint loads only on the same sharding)",
                  x->name, fmt::join(vec(got), ", "), fmt::join(vec(want), ", "));
    const auto& shard = sd.at(x->name + ".flat_shard");
    TESSERA_CHECK(shard.numel() == x->master.numel(),
                  "FullyShardedDataParallel::loadShardedStateDict: '{}.flat_shard' has {} elements, expected {}",
                  x->name, shard.numel(), x->master.numel());
    x->master.copy_(shard.reshape({-1}));
  }
}

}  // namespace tessera
