// DataParallel over sharded parameters: FSDP with one unit per part and ShardedAdamW (see
// data_parallel.h). Checkpoints and exports gather the units' flat shards (sharded_pieces.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "tessera/common/error.h"
#include "tessera/parallel/data_parallel/data_parallel.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"
#include "parallel/data_parallel/pieces.h"
#include "parallel/data_parallel/sharded_pieces.h"
#include "parallel/data_parallel/wrappers.h"

namespace tessera {

namespace {

// Every chunk's units, in order, and the unit each part runs in.
struct Units {
  std::vector<FsdpUnitSpec> specs;
  std::vector<std::vector<size_t>> ofPart;  // [chunk][part] -> unit
};

Units unitsOf(const ModelChunks& chunks, const DataParallelOptions& o) {
  Units u;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto prefix = c < o.chunkNames.size() ? o.chunkNames[c] : fmt::format("chunk{}", c);
    auto pu = partUnits(chunks[c], prefix, o.keepGathered);
    for (auto& k : pu.unitOf) k += u.specs.size();
    for (auto& spec : pu.units) u.specs.push_back(std::move(spec));
    u.ofPart.push_back(std::move(pu.unitOf));
  }
  return u;
}

class Sharded : public DataParallel {
 public:
  Sharded(const ModelChunks& chunks, CommPtr group, DataParallelOptions o)
      : chunks_(chunks), params_(dp::allParams(chunks)) {
    for (const auto& p : params_) byName_[p.name] = &p;
    auto units = unitsOf(chunks, o);
    unitOf_ = std::move(units.ofPart);
    if (o.autoPrefetchBudget) {
      o.fsdp.prefetchBudgetBytes = autoPrefetchBudget(units.specs, o.fsdp.paramDtype, o.fsdp.reshardAfterForward);
    }
    keepThroughStep_ = o.keepGatheredThroughStep;
    everyMicroBatch_ = o.reduceEveryMicroBatch;
    fsdp_ = std::make_unique<FullyShardedDataParallel>(std::move(units.specs), std::move(group), o.fsdp);
    adam_ = std::make_unique<ShardedAdamW>(*fsdp_, o.adam, o.decays);
  }

  at::Tensor run(size_t chunk, size_t part, const at::Tensor& x) override {
    return fsdp_->runUnit(unitOf_[chunk][part], x, chunks_[chunk][part].run);
  }
  void hold() override {
    if (!everyMicroBatch_) noSync_ = std::make_unique<FullyShardedDataParallel::NoSync>(*fsdp_);
    held_ = true;
    keep_.reset();
    if (keepThroughStep_) keep_ = std::make_unique<FullyShardedDataParallel::KeepGathered>(*fsdp_);
  }
  void release() override {
    noSync_.reset();
    held_ = false;
  }
  bool held() const override { return held_; }
  void reduceHeld() override {
    throw Error("data parallel: FSDP reduce-scatters a unit's gradients inside its backward; it cannot reduce after "
                "deferred weight-gradient passes (zero-bubble schedules): use DDP");
  }

  std::vector<GradPiece> gradPieces(int tp) const override {
    std::vector<GradPiece> out;
    const int r = fsdp_->shardRank();
    for (size_t u = 0; u < fsdp_->numUnits(); ++u) {
      const auto& lay = fsdp_->layout(u);
      auto g = fsdp_->gradShard(u);
      const int64_t lo = r * lay.shardNumel, hi = lo + lay.shardNumel;
      for (const auto& e : lay.entries) {
        const int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
        if (!e.trainable || a >= b) continue;
        dp::addGradPieces(out, g.narrow(0, a - lo, b - a), a - e.offset, *byName_.at(e.name), tp);
      }
    }
    return out;
  }
  CommPtr normGroup() const override { return fsdp_->world(); }

  at::Tensor partGrad(size_t chunk, size_t part) override {
    const size_t u = unitOf_.at(chunk).at(part);
    TESSERA_CHECK(chunks_[chunk][part].params.size() == 1 && fsdp_->layout(u).entries.size() == 1,
                  "data parallel: part '{}' must own exactly one parameter, alone in its unit",
                  chunks_[chunk][part].name);
    return fsdp_->gradShard(u);
  }

  void step(double lr, const at::Tensor& gradScale) override {
    keep_.reset();  // resharded before the update changes the masters
    adam_->options().lr = lr;
    adam_->step(gradScale);
    adam_->zeroGrad();
  }
  void skipStep() override {
    keep_.reset();
    adam_->zeroGrad();
  }
  // A forward without backward leaves FSDP's pass open and its non-resharding units gathered: end it,
  // or the next checkpoint's unshardAll() is refused ("called inside a forward/backward pass").
  void endForwardOnly() override {
    keep_.reset();
    fsdp_->reshardAll();
  }

  std::vector<checkpoint::Piece> savePieces(const PieceSource& modelPieces) override {
    auto full = std::make_shared<dp::FlatFull>(dp::flatFull(*fsdp_, *adam_, /*gather=*/true));
    return dp::fsdpTrainingPieces(*fsdp_, modelPieces, params_, full);
  }
  TrainingPieces loadPieces(const PieceSource& modelPieces) override {
    auto full = std::make_shared<dp::FlatFull>(dp::flatFull(*fsdp_, *adam_, /*gather=*/false));
    auto pieces = dp::fsdpTrainingPieces(*fsdp_, modelPieces, params_, full);
    return {std::move(pieces), [this, full](int64_t step) { dp::keepShards(*fsdp_, *adam_, *full, step); }};
  }
  Lookup exportLookup(const PieceSource& modelPieces) override {
    return dp::gatheringLookup(*fsdp_, modelPieces, params_);
  }

  std::string describe() const override {
    const auto& fo = fsdp_->options();
    return fmt::format("FSDP over {} units, prefetch budget {} MiB{}{}{}", fsdp_->numUnits(),
                       fo.prefetchBudgetBytes >> 20,
                       fo.gatherEmbeddingRows ? "; the tied table's lookup rows gathered" : "",
                       keepThroughStep_ ? "; units gathered once per step (--fsdp-keep-gathered)" : "",
                       everyMicroBatch_ ? "; gradients reduce-scattered every micro-batch (--fsdp-accumulate)" : "");
  }

 private:
  ModelChunks chunks_;
  std::vector<NamedParam> params_;
  std::map<std::string, const NamedParam*> byName_;  // into params_, for the units' entries
  std::vector<std::vector<size_t>> unitOf_;
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
  std::unique_ptr<ShardedAdamW> adam_;
  std::unique_ptr<FullyShardedDataParallel::NoSync> noSync_;
  bool held_ = false;
  bool everyMicroBatch_ = false;  // reduceEveryMicroBatch: hold() keeps synchronisation on
  bool keepThroughStep_ = false;
  std::unique_ptr<FullyShardedDataParallel::KeepGathered> keep_;  // declared after fsdp_: ends first
};

}  // namespace

PartUnits partUnits(const std::vector<ModelPart>& parts, const std::string& prefix,
                    const std::function<bool(const ModelPart&)>& keepGathered) {
  PartUnits out;
  for (const auto& part : parts) {
    if (part.sharesParamsOf >= 0) {
      TESSERA_CHECK(static_cast<size_t>(part.sharesParamsOf) < out.unitOf.size(),
                    "data parallel: part '{}' shares the parameters of a later part", part.name);
      const size_t shared = out.unitOf[part.sharesParamsOf];
      out.units[shared].reshardAfterForward = false;  // run first and last
      out.unitOf.push_back(shared);
      continue;
    }
    FsdpUnitSpec spec;
    spec.name = fmt::format("{}.{}", prefix, part.name);
    for (const auto& p : part.params) spec.params.emplace_back(p.name, p.tensor);
    if (keepGathered && keepGathered(part)) spec.reshardAfterForward = false;
    out.unitOf.push_back(out.units.size());
    out.units.push_back(std::move(spec));
  }
  return out;
}

std::unique_ptr<DataParallel> dp::sharded(const ModelChunks& chunks, CommPtr group, DataParallelOptions o) {
  return std::make_unique<Sharded>(chunks, std::move(group), std::move(o));
}

std::unique_ptr<DataParallel> shard(const ModelChunks& chunks, CommPtr group, DataParallelOptions o) {
  if (dp::splitsExperts(chunks, o)) return dp::splitExperts(chunks, std::move(group), std::move(o), true);
  return dp::sharded(chunks, std::move(group), std::move(o));
}

}  // namespace tessera
