#pragma once
// Deferred weight gradients for zero-bubble pipelines (pipeline/schedule.h's ZB-H1): backward split
// into B (input gradients) and W (weight gradients), W run later to fill the pipeline's idle time.
// While a DeferWeightGrads scope is open, nn::accumulateWeightGrad and nn::accumulateBiasGrad
// (accum_linear.h: the float32 GEMM accumulation of every tessera linear) record their work in the
// scope's queue instead of running it; queue.run() runs it later, in order, bit for bit the same.
// Other gradients (norm weights, embeddings, autograd-computed ones such as FSDP units') stay in B.
// Hooks on the parameters' gradient accumulators (DDP's) fire in B, before W has added to .grad:
// keep data-parallel reduction out of a split backward.
// Process-wide, not per thread (CUDA backward runs on autograd's device thread); one scope at a
// time (a second is a tessera::Error). A queue holds its recorded tensors until run or destroyed.
// Local; CUDA work is queued on the stream current when run() is called. docs/design/nn.md.
#include <cstddef>
#include <functional>
#include <vector>

namespace tessera::nn {

class WeightGradQueue {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs the recorded work in order, with grad mode off as in backward, and empties the queue
  // (also when a piece throws: the rest is dropped, the error propagates).
  void run();
  size_t size() const { return work_.size(); }
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};

class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradQueue& into);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;
};

// The queue of the open scope, or nullptr.
WeightGradQueue* deferringWeightGrads();

}  // namespace tessera::nn
