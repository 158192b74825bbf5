// DataParallel over replicated parameters: DDP's bucketed all-reduce and AdamW over whole tensors
// (see data_parallel.h). Checkpoint pieces are views of the parameters and of AdamW's state.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "tessera/common/error.h"
#include "tessera/parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/pieces.h"
#include "parallel/data_parallel/wrappers.h"

namespace tessera {

namespace {

class Replicated : public DataParallel {
 public:
  Replicated(const ModelChunks& chunks, CommPtr group, DataParallelOptions o)
      : chunks_(chunks), params_(dp::allParams(chunks)), replicas_(group->size()) {
    DistributedDataParallel::Named named;
    std::vector<at::Tensor> tensors;
    std::vector<std::string> names;
    std::vector<bool> decay;
    for (const auto& p : params_) {
      named.emplace_back(p.name, p.tensor);
      tensors.push_back(p.tensor);
      names.push_back(p.name);
      decay.push_back(!o.decays || o.decays(p.name));
    }
    ddp_ = std::make_unique<DistributedDataParallel>(named, DistributedDataParallel::Named{}, std::move(group), o.ddp);
    adam_ = std::make_unique<optim::AdamW>(tensors, names, decay, o.adam, o.multiTensorAdam);
  }

  at::Tensor run(size_t chunk, size_t part, const at::Tensor& x) override { return chunks_[chunk][part].run(x); }
  void hold() override { noSync_ = std::make_unique<DistributedDataParallel::NoSync>(*ddp_); }
  void release() override { noSync_.reset(); }
  bool held() const override { return noSync_ != nullptr; }
  void reduceHeld() override {
    noSync_.reset();
    ddp_->reduceGradients();
  }

  std::vector<GradPiece> gradPieces(int tp) const override {
    std::vector<GradPiece> out;
    for (const auto& p : params_) dp::addGradPieces(out, p.tensor.grad().view({-1}), 0, p, tp);
    return out;
  }
  CommPtr normGroup() const override { return nullptr; }

  at::Tensor partGrad(size_t chunk, size_t part) override {
    const auto& ps = chunks_.at(chunk).at(part).params;
    TESSERA_CHECK(ps.size() == 1, "data parallel: part '{}' owns {} parameters, not one", chunks_[chunk][part].name,
                  ps.size());
    return ps[0].tensor.grad();
  }

  void step(double lr, const at::Tensor& gradScale) override {
    adam_->setLr(lr);
    adam_->step(gradScale);
    ddp_->zeroGrad();
  }
  void skipStep() override { ddp_->zeroGrad(); }
  void endForwardOnly() override {}

  std::vector<checkpoint::Piece> savePieces(const PieceSource& modelPieces) override {
    return dp::trainingPieces(modelPieces(), params_, view());
  }
  TrainingPieces loadPieces(const PieceSource& modelPieces) override {
    return {dp::trainingPieces(modelPieces(), params_, view()), [this](int64_t step) { adam_->setSteps(step); }};
  }
  Lookup exportLookup(const PieceSource& modelPieces) override {
    std::map<std::string, std::vector<checkpoint::Piece>> byName;
    for (auto& p : modelPieces()) byName[p.name].push_back(std::move(p));
    return [byName = std::move(byName)](const std::string& name) {
      const auto it = byName.find(name);
      return it == byName.end() ? std::vector<checkpoint::Piece>{} : it->second;
    };
  }

  std::string describe() const override {
    const auto layout = ddp_->bucketLayout();
    if (layout.empty() || replicas_ == 1) return "";  // one replica: nothing is all-reduced
    auto names = [](const std::vector<std::string>& b) {
      std::vector<std::string> shown(b.begin(), b.begin() + std::min<size_t>(b.size(), 3));
      return fmt::format("{}{}", fmt::join(shown, ", "), b.size() > 3 ? fmt::format(" and {} more", b.size() - 3) : "");
    };
    return fmt::format(
        "DDP all-reduces {} bucket(s), built in this run's first step's gradient-ready order; first: {}; last: {}",
        layout.size(), names(layout.front()), names(layout.back()));
  }

 private:
  // (piece, its parameter, what) -> the parameter's view, or the same box of AdamW's state.
  dp::ViewFn view() const {
    return [this](const checkpoint::Piece& piece, size_t k, int what) {
      if (what == 0) return piece.local;
      const auto& state = what == 1 ? adam_->expAvg()[k] : adam_->expAvgSq()[k];
      return dp::sameBox(piece.local, params_[k].tensor, state, 0);
    };
  }

  ModelChunks chunks_;
  std::vector<NamedParam> params_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<optim::AdamW> adam_;
  std::unique_ptr<DistributedDataParallel::NoSync> noSync_;
  int replicas_ = 1;  // the data group's size
};

}  // namespace

std::unique_ptr<DataParallel> dp::replicated(const ModelChunks& chunks, CommPtr group, DataParallelOptions o) {
  return std::make_unique<Replicated>(chunks, std::move(group), std::move(o));
}

std::unique_ptr<DataParallel> replicate(const ModelChunks& chunks, CommPtr group, DataParallelOptions o) {
  if (dp::splitsExperts(chunks, o)) return dp::splitExperts(chunks, std::move(group), std::move(o), false);
  return dp::replicated(chunks, std::move(group), std::move(o));
}

}  // namespace tessera
