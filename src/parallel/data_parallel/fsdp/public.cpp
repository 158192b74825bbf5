// The public class (fsdp.h): its calls are the implementation's (impl.h).
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "parallel/data_parallel/fsdp/impl.h"

namespace tessera {

FullyShardedDataParallel::FullyShardedDataParallel(std::vector<FsdpUnitSpec> units, CommPtr comm, FsdpOptions options)
    : impl_(std::make_unique<Impl>(std::move(units), std::move(comm), std::move(options))) {}
FullyShardedDataParallel::~FullyShardedDataParallel() = default;

at::Tensor FullyShardedDataParallel::runUnit(size_t unit, const at::Tensor& input, const Fn& fn) {
  auto out = impl_->runUnit(unit, std::vector<at::Tensor>{input},
                            [&fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; });
  return out[0];
}
std::vector<at::Tensor> FullyShardedDataParallel::runUnit(size_t unit, const std::vector<at::Tensor>& inputs,
                                                          const MultiFn& fn) {
  return impl_->runUnit(unit, inputs, fn);
}
void FullyShardedDataParallel::reshardAll() { impl_->reshardAll(); }
std::vector<int> FullyShardedDataParallel::leadingUnits() const { return impl_->leadingUnits(); }
std::vector<int> FullyShardedDataParallel::reduceOrder() const { return impl_->reduceOrder(); }
void FullyShardedDataParallel::gatherForNextForward(const std::vector<int>& units) {
  impl_->gatherForNextForward(units);
}
void FullyShardedDataParallel::unshardAll() { impl_->unshardAll(); }

FullyShardedDataParallel::NoSync::NoSync(FullyShardedDataParallel& f) : f_(f), prev_(f.impl_->sync_) {
  f_.impl_->sync_ = false;
}
FullyShardedDataParallel::NoSync::~NoSync() { f_.impl_->sync_ = prev_; }

FullyShardedDataParallel::KeepGathered::KeepGathered(FullyShardedDataParallel& f) : f_(f) {
  TESSERA_CHECK(!f_.impl_->keep_, "FullyShardedDataParallel::keepGathered: a KeepGathered scope is open already");
  f_.impl_->keep_ = true;
}
FullyShardedDataParallel::KeepGathered::~KeepGathered() {
  try {
    f_.impl_->endKeep();
  } catch (const std::exception& e) {  // a destructor must not throw: the failure that caused this reports itself
    log::warn("FullyShardedDataParallel::KeepGathered: resharding at the scope's end failed: {}", e.what());
  }
}
bool FullyShardedDataParallel::keepingGathered() const { return impl_->keep_; }

void FullyShardedDataParallel::zeroGrad() { impl_->zeroGrad(); }
void FullyShardedDataParallel::setGradViews(size_t u, std::vector<std::pair<int64_t, at::Tensor>> views) {
  impl_->setGradViews(u, std::move(views));
}
at::Tensor FullyShardedDataParallel::clipGradNorm(double maxNorm) { return impl_->clipGradNorm(maxNorm); }

size_t FullyShardedDataParallel::numUnits() const { return impl_->units_.size(); }
const std::string& FullyShardedDataParallel::unitName(size_t u) const { return impl_->units_.at(u)->name; }
const fsdp::FlatLayout& FullyShardedDataParallel::layout(size_t u) const { return impl_->units_.at(u)->layout; }
at::Tensor FullyShardedDataParallel::masterShard(size_t u) const { return impl_->units_.at(u)->master; }
at::Tensor FullyShardedDataParallel::gradShard(size_t u) const { return impl_->gradShard(u); }
int FullyShardedDataParallel::shardRank() const { return impl_->shardComm_->rank(); }
at::Tensor FullyShardedDataParallel::gatherFull(size_t u, const at::Tensor& shard) const {
  return impl_->gatherFull(u, shard);
}
const CommPtr& FullyShardedDataParallel::shardGroup() const { return impl_->shardComm_; }
const CommPtr& FullyShardedDataParallel::replicaGroup() const { return impl_->replicaComm_; }
const CommPtr& FullyShardedDataParallel::world() const { return impl_->world_; }

std::map<std::string, at::Tensor> FullyShardedDataParallel::fullStateDict() { return impl_->fullStateDict(); }
void FullyShardedDataParallel::loadFullStateDict(const std::map<std::string, at::Tensor>& sd) {
  impl_->loadFullStateDict(sd);
}
std::map<std::string, at::Tensor> FullyShardedDataParallel::shardedStateDict() const {
  return impl_->shardedStateDict();
}
void FullyShardedDataParallel::loadShardedStateDict(const std::map<std::string, at::Tensor>& sd) {
  impl_->loadShardedStateDict(sd);
}

const FsdpStats& FullyShardedDataParallel::stats() const { return impl_->stats_; }
void FullyShardedDataParallel::resetStats() { impl_->resetStats(); }
const FsdpOptions& FullyShardedDataParallel::options() const { return impl_->opts_; }

}  // namespace tessera
