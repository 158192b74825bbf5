// DataParallel with expert parallelism (wrappers.h): the experts' weights by one wrapper over the
// expert-data group, everything else by one over the data group, both of the same kind.
//
// A part with experts runs through the experts' wrapper around the dense one (FSDP: both units
// gathered around it). The experts' gradients arrive as means over the ep ranks (models/moe.h), so
// each wrapper's average over its own group gives the data group's mean. The global norm: beside
// replicas (DDP) the experts differ over the ep group and the dense pieces repeat there (weight
// 1/ep, summed over ep); with shards (FSDP) every piece is summed over the data group once.
#include <fmt/format.h>

#include <set>

#include "parallel/data_parallel/pieces.h"
#include "parallel/data_parallel/sharded_pieces.h"
#include "parallel/data_parallel/wrappers.h"
#include "tessera/common/error.h"

namespace tessera::dp {

namespace {

class ExpertSplit : public DataParallel {
 public:
  ExpertSplit(const ModelChunks& chunks, CommPtr group, DataParallelOptions o, bool sharded)
      : sharded_(sharded), group_(group), ep_(o.ep), all_(allParams(chunks)) {
    ModelChunks dense(chunks.size()), experts(chunks.size());
    expertPart_.resize(chunks.size());
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (size_t p = 0; p < chunks[c].size(); ++p) {
        auto d = chunks[c][p];
        ModelPart e{d.name, [this, c, p](const at::Tensor& x) { return dense_->run(c, p, x); }, {}, -1};
        d.params.clear();
        for (const auto& param : chunks[c][p].params) (param.expert ? e.params : d.params).push_back(param);
        for (const auto& param : e.params) expertNames_.insert(param.name);
        expertPart_[c].push_back(e.params.empty() ? -1 : static_cast<int>(experts[c].size()));
        if (!e.params.empty()) experts[c].push_back(std::move(e));
        dense[c].push_back(std::move(d));
      }
    }
    auto eo = o;
    eo.ep = eo.expertData = nullptr;
    eo.ddp.gatherEmbeddingRows = eo.fsdp.gatherEmbeddingRows = false;  // the table is no expert
    eo.ddp.onBucketReduced = nullptr;
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (c >= eo.chunkNames.size()) eo.chunkNames.push_back(fmt::format("chunk{}", c));
      eo.chunkNames[c] += ".experts";
    }
    auto data = o;
    data.ep = data.expertData = nullptr;
    TESSERA_CHECK(o.expertData, "data parallel: expert parallel over '{}' without an expert-data group", ep_->name());
    dense_ = sharded ? dp::sharded(dense, std::move(group), std::move(data))
                     : dp::replicated(dense, std::move(group), std::move(data));
    experts_ = sharded ? dp::sharded(experts, o.expertData, std::move(eo)) : dp::replicated(experts, o.expertData, eo);
  }

  at::Tensor run(size_t chunk, size_t part, const at::Tensor& x) override {
    const int e = expertPart_.at(chunk).at(part);
    return e < 0 ? dense_->run(chunk, part, x) : experts_->run(chunk, static_cast<size_t>(e), x);
  }
  void hold() override {
    both([](DataParallel& w) { w.hold(); });
  }
  void release() override {
    both([](DataParallel& w) { w.release(); });
  }
  bool held() const override { return dense_->held(); }
  void reduceHeld() override {
    both([](DataParallel& w) { w.reduceHeld(); });
  }

  std::vector<GradPiece> gradPieces(int tp) const override {
    auto out = dense_->gradPieces(tp);
    if (!sharded_) {
      for (auto& piece : out) piece.weight /= ep_->size();
    }
    for (auto& piece : experts_->gradPieces(tp)) out.push_back(std::move(piece));
    return out;
  }
  CommPtr normGroup() const override { return sharded_ ? group_ : ep_; }
  at::Tensor partGrad(size_t chunk, size_t part) override { return dense_->partGrad(chunk, part); }

  void step(double lr, const at::Tensor& gradScale) override {
    both([&](DataParallel& w) { w.step(lr, gradScale); });
  }
  void skipStep() override {
    both([](DataParallel& w) { w.skipStep(); });
  }
  void endForwardOnly() override {
    both([](DataParallel& w) { w.endForwardOnly(); });
  }

  std::vector<checkpoint::Piece> savePieces(const PieceSource& modelPieces) override {
    auto out = dense_->savePieces(only(modelPieces, false));
    for (auto& p : experts_->savePieces(only(modelPieces, true))) out.push_back(std::move(p));
    return out;
  }
  TrainingPieces loadPieces(const PieceSource& modelPieces) override {
    auto d = dense_->loadPieces(only(modelPieces, false));
    auto e = experts_->loadPieces(only(modelPieces, true));
    for (auto& p : e.pieces) d.pieces.push_back(std::move(p));
    return {std::move(d.pieces), [dc = d.commit, ec = e.commit](int64_t step) {
              dc(step);
              ec(step);
            }};
  }
  Lookup exportLookup(const PieceSource& modelPieces) override {
    auto d = dense_->exportLookup(only(modelPieces, false));
    auto e = experts_->exportLookup(only(modelPieces, true));
    return [d, e, this](const std::string& name) { return expertNames_.count(name) ? e(name) : d(name); };
  }

  std::string describe() const override {
    const auto d = dense_->describe(), e = experts_->describe();
    return fmt::format("{}{}experts over ep {}{}{}", d, d.empty() ? "" : "; ", ep_->size(), e.empty() ? "" : ": ", e);
  }

 private:
  template <typename F>
  void both(F&& f) {
    f(*dense_);
    f(*experts_);
  }
  // The model's pieces of the experts (or of the rest: the pieces of state go there), taken while
  // every parameter has a storage for its views (one wrapper sizes only its own).
  PieceSource only(const PieceSource& source, bool experts) const {
    return [this, source, experts] {
      std::vector<checkpoint::Piece> out;
      for (auto& p : piecesOfSized(all_, source)) {
        if ((expertNames_.count(p.name) > 0) == experts) out.push_back(std::move(p));
      }
      return out;
    };
  }

  bool sharded_;
  CommPtr group_, ep_;
  std::vector<NamedParam> all_;
  std::set<std::string> expertNames_;
  std::vector<std::vector<int>> expertPart_;  // [chunk][part] -> the part's index in experts_ (-1: none)
  std::unique_ptr<DataParallel> dense_, experts_;
};

}  // namespace

bool splitsExperts(const ModelChunks& chunks, const DataParallelOptions& o) {
  if (!o.ep || o.ep->size() == 1) return false;
  for (const auto& p : allParams(chunks)) {
    if (p.expert) return true;
  }
  return false;
}

std::unique_ptr<DataParallel> splitExperts(const ModelChunks& chunks, CommPtr group, DataParallelOptions o,
                                           bool sharded) {
  return std::make_unique<ExpertSplit>(chunks, std::move(group), std::move(o), sharded);
}

}  // namespace tessera::dp
