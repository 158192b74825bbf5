#include "batches.h"

#include <fmt/format.h>

#include "common/error.h"
#include "data/random.h"
#include "parallel/context/chunks.h"
#include "synthetic_data.h"

namespace tessera::gpt {

Batches::Batches(const TrainOptions& o, int dpRank, at::Device device, int cpRank)
    : o_(o), dpRank_(dpRank), device_(device), cpRank_(cpRank) {
  if (o.data == "synthetic") return;
  data::DataOptions d;
  d.train = o.data;
  d.valid = o.validData;
  d.split = o.split;
  d.format = o.dataFormat;
  d.seqLen = o.cfg.seqLen;
  d.seed = o.seed;
  d.eodToken = o.eodToken;
  corpus_ = std::make_shared<data::GptData>(d);
}

void Batches::start(const data::DataState* saved, int64_t step) {
  consumed_ = step * o_.batch;
  if (saved) consumed_ = data::resumePosition(*saved, state());
  if (!corpus_) return;
  data::LoaderOptions lo;
  lo.globalBatch = o_.batch;
  lo.rows = o_.batch / o_.dp;
  lo.rowBegin = dpRank_ * lo.rows;
  lo.vocab = o_.cfg.vocab;
  lo.device = device_;
  std::shared_ptr<const data::Blend> train(corpus_, &corpus_->train());
  loader_ = std::make_unique<data::BatchLoader>(train, lo, consumed_);
}

data::TokenBatch Batches::mine(data::TokenBatch b) const {
  if (o_.cp == 1) return b;
  return {cp::shard(b.tokens, 1, o_.cp, cpRank_), cp::shard(b.targets, 1, o_.cp, cpRank_)};
}

data::TokenBatch Batches::next(int64_t step) {
  consumed_ += o_.batch;
  if (loader_) return mine(loader_->next());
  const int64_t local = o_.batch / o_.dp;
  auto b = batchRows(o_.seed, step, o_.batch, dpRank_ * local, local, o_.cfg.vocab, o_.cfg.seqLen, device_);
  return mine({b.tokens, b.targets});
}

data::TokenBatch Batches::validBatch(int64_t k) {
  TESSERA_CHECK(corpus_ && corpus_->valid(), "train_gpt: no validation data (--split with a validation share, or "
                                             "--valid-data)");
  const int64_t rows = o_.batch / o_.dp;
  auto s = data::readSamples(*corpus_->valid(), k * o_.batch + dpRank_ * rows, rows, o_.cfg.vocab);
  auto b = data::splitSamples(s.to(device_));
  return mine({b.tokens.contiguous(), b.targets.contiguous()});
}

data::DataState Batches::state() const {
  if (corpus_) return {consumed_, corpus_->fingerprint(), fmt::format("{} (split {}, seed {}, seq-len {})", o_.data,
                                                                       o_.split, o_.seed, o_.cfg.seqLen)};
  return {consumed_, data::mix64(o_.seed ^ 0x5e17e71cull), fmt::format("synthetic (seed {})", o_.seed)};
}

std::string Batches::describe() const { return corpus_ ? corpus_->describe() : state().description; }

}  // namespace tessera::gpt
