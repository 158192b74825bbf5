#pragma once
// Prepares the next batches on a background thread (local; no communication), so reading
// and checking tokens never shows in the step time: batch k (k = 0, 1, ...) is samples
// [first + k · globalBatch + rowBegin, + rows) of `data` (data/batch.h's rows of one rank).
// On a CUDA device the thread fills pinned host memory and next() issues the copy to the
// device asynchronously on the current stream (the caching host allocator keeps each pinned
// buffer until its copy is done). The batches are the same whatever the timing.
// Errors the thread meets (a token outside the vocabulary, ...) are rethrown by next().
// next() is called by one thread; the destructor stops the background thread.
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "tessera/data/batch.h"

namespace tessera::data {

struct LoaderOptions {
  int64_t globalBatch = 0;  // samples per step
  int64_t rowBegin = 0;     // this rank's first row of the global batch
  int64_t rows = 0;         // this rank's rows
  int64_t vocab = 0;        // token ids must be below it
  at::Device device = at::kCPU;
  int depth = 2;            // batches prepared ahead
};

class BatchLoader {
 public:
  // `first`: the first step's first sample (steps already trained × globalBatch on resume).
  BatchLoader(std::shared_ptr<const Blend> data, LoaderOptions o, int64_t first);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next step's batch on the device (blocks until it is ready).
  TokenBatch next();

 private:
  void run();
  std::shared_ptr<const Blend> data_;
  LoaderOptions o_;
  int64_t next_;  // first sample of the next batch the thread prepares
  std::mutex mu_;
  std::condition_variable cv_;
  // CPU: inputs and targets, contiguous; CUDA: the pinned [rows, seqLen + 1] samples in `tokens`.
  std::deque<TokenBatch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera::data
