#pragma once
// tessera::DistributedDataParallel: data parallelism by bucketed gradient all-reduce, overlapped
// with backward. Every rank of `comm` wraps the same parameters; the caller keeps owning them.
// - Construction is collective over `comm`: when any rank's arguments are unusable, or the ranks
//   differ in options, parameters or buffers, every rank throws the same tessera::Error (naming each
//   rank's problem, or the first difference); then rank 0's parameters and buffers are broadcast.
// - A synchronised backward all-reduces each bucket on the communicator's stream as soon as its
//   gradients are ready. When backward returns (CPU), or on the caller's current stream (CUDA),
//   every parameter's .grad holds the average over the ranks of their local .grad.
// - A synchronised backward must give every parameter with requires_grad a gradient, unless
//   findUnusedParameters. Else tessera::Error names them, at the end of backward, on that rank
//   only (after its all-reduces); a rank that goes on without the step lets the replicas drift.
// - A group of one communicates nothing (onBucketReduced and overwriteStaleGrads still apply).
//   Not thread-safe: one backward at a time. The object must outlive every backward over its
//   parameters. Why it is built so: docs/design/ddp.md.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera {

struct DdpOptions {
  // Bytes (in the parameters' dtype) per bucket; the first bucket (the last layers, whose
  // gradients are ready first) is smaller so communication starts early.
  size_t bucketCapBytes = 25u << 20;
  size_t firstBucketCapBytes = 1u << 20;
  // .grad of each parameter becomes a view into its bucket (no second copy). Requires commDtype
  // unset or the parameters' dtype. Zero with ddp.zeroGrad(), not by setting .grad to None (the
  // view is then re-made by a copy on the next backward).
  bool gradientAsBucketView = false;
  // Communicate gradients in this dtype (at::kBFloat16 / at::kHalf) and cast back; the
  // division by the world size happens before the cast.
  std::optional<c10::ScalarType> commDtype;
  // Parameters without a gradient in a synchronised backward contribute their current .grad
  // (zeros if undefined) instead of raising. Their buckets are reduced at the end of backward.
  bool findUnusedParameters = false;
  // syncBuffers() broadcasts buffers from rank 0 (BatchNorm statistics, ...).
  bool broadcastBuffers = true;
  // Rebuild buckets in the observed ready order after the first synchronised backward.
  bool rebuildBuckets = true;
  // SMs that backward's GEMMs leave free for the all-reduces from the first bucket's launch
  // to the end of backward (common/sm_carveout.h; GPUs with LibTorch >= 2.7, else ignored).
  // 0: GEMMs use every SM.
  int smCarveout = 0;
  // Optimizer in backward: called once per bucket of a synchronised backward with its parameters
  // (each exactly once), once their averages are in .grad. CUDA: on the autograd thread, with a
  // side stream current that waits for the all-reduce; the caller's stream waits for it at the end
  // of backward. The rest of backward must not read these parameters, nor anything scale their
  // gradients later (no global-norm clipping). Not with findUnusedParameters. Errors propagate.
  std::function<void(const std::vector<at::Tensor>& params)> onBucketReduced;
  // zeroGrad() marks the gradients stale instead of zeroing them (nn/stale_grads.h): the next
  // backward's first writer of each overwrites it. Between zeroGrad() and the end of the next
  // synchronised backward (or reduceGradients()) .grad holds garbage. Local: ranks may differ.
  bool overwriteStaleGrads = false;
  // In a synchronised backward the rows an embedding lookup (nn::embeddingAccumulateGrad) would sum
  // into a parameter's .grad are all-gathered instead and added, divided by the group size, at the
  // end of backward (nn/accum_embedding.h's row-gradient sinks). Every rank must look up the same
  // number of ids, each below 2^24. Not with onBucketReduced. Under noSync, or in a group of one,
  // the rows are summed into .grad as usual.
  bool gatherEmbeddingRows = false;
};

class Reducer;

// A backward that raises before its end (a hook, onBucketReduced, the model's backward) leaves .grad
// unspecified: call zeroGrad() before the next step (with gradientAsBucketView, before anything
// writes .grad). That rank's next zeroGrad() or synchronised backward first completes the aborted
// backward's collectives (on zeros), so the ranks' collectives stay matched; the other ranks wait at
// the end of their backward until then (or for the communicator's timeout).
// Example:
//   tessera::DistributedDataParallel::Named params, buffers;
//   for (auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
//   for (auto& b : model->named_buffers()) buffers.emplace_back(b.key(), b.value());
//   tessera::DistributedDataParallel ddp(params, buffers, comm);  // collective: every rank of comm
//   torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4));
//   for (int step = 0; step < steps; ++step) {
//     ddp.syncBuffers();                                   // rank 0's buffers (broadcastBuffers)
//     lossFn(model->forward(tokens), targets).backward();  // .grad: the average over comm's ranks
//     opt.step();
//     ddp.zeroGrad();
//   }
//   {
//     auto guard = ddp.noSync();  // backward only accumulates .grad locally while it lives
//     lossFn(model->forward(tokens), targets).backward();
//   }
class DistributedDataParallel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  DistributedDataParallel(Named parameters, Named buffers, CommPtr comm, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Collective when broadcastBuffers (no-op otherwise): buffers from rank 0.
  void syncBuffers();
  // Local: zeroes every parameter's .grad in place (keeps bucket views), or with
  // overwriteStaleGrads marks them for the next backward to overwrite. After a synchronised
  // backward that raised, it first completes that backward's collectives (see the class).
  void zeroGrad();

  // While a NoSync lives, backward passes only accumulate .grad locally.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d);
    ~NoSync();
    NoSync(const NoSync&) = delete;

   private:
    DistributedDataParallel& d_;
    bool prev_;
  };
  NoSync noSync() { return NoSync(*this); }

  // Collective over `comm`: averages every .grad now, as a synchronised backward's end would (no
  // .grad: zeros), for gradients finished after backward (ZB-H1's W; backward ran under noSync).
  // CUDA: the caller's stream waits for the all-reduces. tessera::Error inside a synchronised backward.
  void reduceGradients();

  // Introspection (tests, logs): parameter names per bucket, in bucket order.
  std::vector<std::vector<std::string>> bucketLayout() const;
  const DdpOptions& options() const;
  const CommPtr& comm() const;

 private:
  std::unique_ptr<Reducer> reducer_;
  Named buffers_;
};

}  // namespace tessera
