#pragma once
// Deferred weight gradients, for zero-bubble pipelines (pipeline/schedule.h's ZB-H1): a
// backward pass split into B (input gradients, what the previous stage waits for) and W (weight
// gradients, what nobody waits for), with W run later to fill the pipeline's idle time.
//
// While a DeferWeightGrads scope is open, nn::accumulateWeightGrad and nn::accumulateBiasGrad
// (nn/accum_linear.h: the float32 GEMM accumulation of every tessera linear, plain and
// tensor-parallel) record their work in the scope's queue instead of running it; queue.run()
// runs it later, in the recorded order, with the same results bit for bit. Other parameters'
// gradients (norm weights, embeddings, layers computing their own weight gradient through
// autograd such as FSDP units) are still computed in B: W is what could be deferred, and a model
// without tessera linears simply has an empty W.
//
// Process-wide, not per thread: on CUDA the autograd engine runs backward on its own device
// thread. One scope at a time (opening a second is a tessera::Error): one backward at a time
// defers. A queue holds its recorded tensors (the layer inputs and output gradients) until run
// or destroyed: that memory stays in flight until W, which the schedules count
// (Schedule::peakInFlight). Autograd hooks on the parameters' gradient accumulators (DDP's
// gradient-ready hooks) fire in B, before W has added to .grad: the callers (the trainer)
// keep data-parallel reduction out of a split backward.
// Local (no communication); CUDA work is queued on the stream current when run() is called.
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
