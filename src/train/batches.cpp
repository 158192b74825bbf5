#include "train/batches.h"

#include <fmt/format.h>

#include "tessera/common/error.h"
#include "data/random.h"
#include "tessera/parallel/context/chunks.h"
#include "tessera/data/synthetic.h"

namespace tessera::train {

Batches::Batches(const Config& o, int dpRank, at::Device device, int cpRank)
    : o_(o), dpRank_(dpRank), device_(device), cpRank_(cpRank) {
  if (o.data.data == "synthetic") return;
  data::DataOptions d;
  d.train = o.data.data;
  d.valid = o.data.validData;
  d.split = o.data.split;
  d.format = o.data.format;
  d.seqLen = o.model.cfg.seqLen;
  d.seed = o.seed;
  d.eodToken = o.data.eodToken;
  corpus_ = std::make_shared<data::GptData>(d);
}

void Batches::start(const data::DataState* saved, int64_t step) {
  started_ = true;
  consumed_ = step * o_.optim.batch;
  if (saved) consumed_ = data::resumePosition(*saved, state());
  if (!corpus_) return;
  data::LoaderOptions lo;
  lo.globalBatch = o_.optim.batch;
  lo.rows = o_.optim.batch / o_.parallel.dp;
  lo.rowBegin = dpRank_ * lo.rows;
  lo.vocab = o_.model.cfg.vocab;
  lo.device = device_;
  std::shared_ptr<const data::Blend> train(corpus_, &corpus_->train());
  loader_ = std::make_unique<data::BatchLoader>(train, lo, consumed_);
}

data::TokenBatch Batches::mine(data::TokenBatch b) const {
  if (o_.parallel.cp == 1) return b;
  return {cp::shard(b.tokens, 1, o_.parallel.cp, cpRank_), cp::shard(b.targets, 1, o_.parallel.cp, cpRank_)};
}

data::TokenBatch Batches::next(int64_t step) {
  consumed_ += o_.optim.batch;
  if (loader_) return mine(loader_->next());
  const int64_t local = o_.optim.batch / o_.parallel.dp;
  auto b = data::syntheticRows(o_.seed, step, o_.optim.batch, dpRank_ * local, local, o_.model.cfg.vocab, o_.model.cfg.seqLen, device_);
  return mine({b.tokens, b.targets});
}

data::TokenBatch Batches::validBatch(int64_t k) {
  TESSERA_CHECK(corpus_ && corpus_->valid(), "train_gpt: no validation data (--split with a validation share, or "
                                             "--valid-data)");
  const int64_t rows = o_.optim.batch / o_.parallel.dp;
  auto s = data::readSamples(*corpus_->valid(), k * o_.optim.batch + dpRank_ * rows, rows, o_.model.cfg.vocab);
  auto b = data::splitSamples(s.to(device_));
  return mine({b.tokens.contiguous(), b.targets.contiguous()});
}

data::DataState Batches::state() const {
  if (corpus_) return {consumed_, corpus_->fingerprint(), fmt::format("{} (split {}, seed {}, seq-len {})", o_.data.data,
                                                                       o_.data.split, o_.seed, o_.model.cfg.seqLen)};
  return {consumed_, data::mix64(o_.seed ^ 0x5e17e71cull), fmt::format("synthetic (seed {})", o_.seed)};
}

std::string Batches::describe() const { return corpus_ ? corpus_->describe() : state().description; }

}  // namespace tessera::train
