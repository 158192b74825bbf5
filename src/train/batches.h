#pragma once
// A run's batches: synthetic (data/synthetic.h) or a tokenized corpus (src/data: Megatron
// .bin/.idx, llm.c shards, raw token files, blends, a training/validation split). Local: every
// rank opens the data itself; rank r of dp reads rows [r·B/dp, (r+1)·B/dp) of each global batch,
// prepared ahead by a loader thread (data/loader.h). The data position (samples consumed) and
// the data's identity go into checkpoints; resuming on other data is an error naming both.
#include <memory>

#include "tessera/data/batch.h"
#include "tessera/data/dataset.h"
#include "tessera/data/loader.h"
#include "tessera/train/config.h"

namespace tessera::train {

class Batches {
 public:
  // Opens the data (--data); errors name the file and what is wrong. With --cp every batch is
  // this cp rank's positions of each row (parallel/context/chunks.h), tokens and targets alike.
  Batches(const Config& o, int dpRank, at::Device device, int cpRank = 0);
  // The position to start at: `saved` from a checkpoint (checked against this data) or the
  // start; then batches flow from step `step` on.
  void start(const data::DataState* saved, int64_t step);
  bool started() const { return started_; }
  // The next step's batch on the device.
  data::TokenBatch next(int64_t step);
  // Validation batch k (the same rows for every call): this rank's rows of global batch k of the
  // validation share. An error when the data has no validation share.
  data::TokenBatch validBatch(int64_t k);
  // The position after the steps taken so far, for a checkpoint.
  data::DataState state() const;
  std::string describe() const;
  const data::GptData* corpus() const { return corpus_.get(); }

 private:
  const Config& o_;
  int dpRank_;
  at::Device device_;
  int cpRank_ = 0;
  data::TokenBatch mine(data::TokenBatch b) const;  // this cp rank's positions
  std::shared_ptr<data::GptData> corpus_;  // null: synthetic
  std::unique_ptr<data::BatchLoader> loader_;
  int64_t consumed_ = 0;  // samples of the global batches taken so far
  bool started_ = false;
};

}  // namespace tessera::train
