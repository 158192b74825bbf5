#pragma once
// tessera::DistributedDataParallel: data parallelism by bucketed gradient all-reduce,
// overlapped with backward.
//
// Usage (every rank of `comm`, same model, different data):
//   tessera::DistributedDataParallel ddp(model->named_parameters(), model->named_buffers(), comm);
//   for (...) {
//     ddp.syncBuffers();                 // buffers from rank 0 (if broadcastBuffers)
//     auto loss = lossFn(model->forward(x), y);
//     loss.backward();                   // gradients are averaged over `comm` when it returns
//     opt.step(); ddp.zeroGrad();
//   }
//   { auto guard = ddp.noSync(); ...backward... }   // accumulate locally, no communication
//
// Contract:
// - Construction is collective over `comm`, and fails on every rank alike (tessera::Error,
//   never a rank left waiting): when any rank's arguments are unusable (no parameters, none
//   with requires_grad, bad options...: the message names each such rank and why), or when
//   the ranks differ in the options that shape buckets and communication (bucket caps,
//   gradientAsBucketView, commDtype, findUnusedParameters, broadcastBuffers, rebuildBuckets,
//   gatherEmbeddingRows),
//   in their parameters (count, names, shapes, dtypes, device type, requires_grad) or in their
//   buffers (count, names, shapes, dtypes, device type): the message names the first
//   differing option, parameter or buffer and what each rank has. Parameters and buffers are
//   then broadcast from rank 0 (buffers whatever broadcastBuffers says).
// - Gradients of parameters with requires_grad are bucketed (reverse registration order at
//   first; after the first synchronised backward, rebuilt in the order gradients became
//   ready on rank 0, the same layout on every rank). A bucket's all-reduce starts as soon as
//   its last gradient is ready, on the communicator's stream, while backward continues.
// - When backward returns (CPU) or on the caller's current stream (CUDA), every parameter's
//   .grad holds the average over the ranks of their local .grad.
// - Every synchronised backward must produce a gradient for every parameter with
//   requires_grad, unless findUnusedParameters: otherwise tessera::Error names the
//   parameters that got none, raised at the end of backward on the rank(s) that saw it, after
//   that rank took part in the step's all-reduces as findUnusedParameters would (the skipped
//   parameters contributing their .grad, zeros if none; the averages land in .grad; with
//   onBucketReduced it ran for every bucket). So ranks whose backward went through finish
//   their step normally and no rank waits for another; they are not told that a rank raised
//   (that would cost a collective per step): if the raising rank goes on without the step
//   (no optimizer step) the ranks' parameters drift apart, and if it ends, the others' next
//   collective fails (peer lost, or the communicator's timeout).
// - A backward that raises before its end (in a hook, in onBucketReduced, in the model's own
//   backward) leaves nothing behind: that rank's next zeroGrad() or synchronised backward
//   first completes the aborted one's collectives (waits for the all-reduces it started,
//   issues the rest on zeros, drops the results), so the ranks' collectives stay matched,
//   then starts clean. When every rank raised, they all do so; when only some did, the
//   others wait at the end of their backward until those catch up (or for the communicator's
//   timeout), and their averages include the aborted ranks' partial gradients or zeros.
//   After an aborted backward .grad hold unspecified values: call zeroGrad() before the next
//   step (with gradientAsBucketView, before anything writes to .grad: until then the aborted
//   all-reduces may still write into them).
// - A group of one (comm->size() == 1) communicates nothing: no buckets, no hooks, .grad as
//   autograd left it (options that shape buckets or communication have no effect), unless
//   onBucketReduced or overwriteStaleGrads is set: then buckets and hooks exist for them,
//   without communication.
// - onBucketReduced (optimizer in backward): see DdpOptions.
// - Not thread-safe: one backward at a time per DDP object. The DDP object must outlive
//   every backward pass over its parameters.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace tessera {

struct DdpOptions {
  // Bytes (in the parameters' dtype) per bucket; the first bucket (the last layers, whose
  // gradients are ready first) is smaller so communication starts early.
  size_t bucketCapBytes = 25u << 20;
  size_t firstBucketCapBytes = 1u << 20;
  // .grad of each parameter becomes a view into its bucket: no second copy of the gradients.
  // Requires commDtype unset (or equal to the parameters' dtype). Use ddp.zeroGrad() (in
  // place) rather than setting gradients to None, or the view is lost (it is re-established,
  // at the cost of a copy, on the next backward).
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
  // Optimizer in backward: called once per bucket and synchronised backward, with the bucket's
  // parameters, once their averaged gradients are in .grad, so an optimizer step over them
  // overlaps the rest of backward and the later buckets' all-reduces instead of following
  // them. On CUDA it runs on the autograd engine's thread with a side stream current that
  // waits for the bucket's all-reduce; at the end of backward the caller's stream waits for
  // that stream (the next forward sees the updated parameters). On the CPU it runs after the
  // all-reduce completed. Every parameter is passed to it exactly once per synchronised
  // backward. The rest of backward must not read these parameters (true unless one parameter
  // serves two layers), and nothing may scale their gradients afterwards (no global-norm
  // clipping: there is no global norm yet when it runs). Not with findUnusedParameters (an
  // error). Exceptions propagate out of backward.
  std::function<void(const std::vector<at::Tensor>& params)> onBucketReduced;
  // zeroGrad() marks the gradients stale instead of zeroing them (nn/stale_grads.h): the next
  // backward's first writer of each replaces it, so the float32 weight-gradient GEMMs
  // (nn/accum_linear.h) write their first product with beta = 0, and the step saves the zeroing
  // pass and one read of every such gradient. Autograd's own gradients (a hook on each
  // parameter) and the embedding's rows zero a stale .grad before adding; the end of the next
  // synchronised backward or reduceGradients() zeroes what nothing wrote. Between zeroGrad() and
  // that end .grad holds garbage: read it only after (as after a synchronised backward anyway).
  // Local: ranks may differ.
  bool overwriteStaleGrads = false;
  // Embedding rows gathered instead of all-reduced (nn/accum_embedding.h's row-gradient sinks, on
  // every parameter): in a synchronised backward, the rows an embedding lookup
  // (nn::embeddingAccumulateGrad) would sum into a parameter's .grad are all-gathered over the
  // group instead (the ids and the rows in the gradient's dtype, as the lookup issues them), and
  // each rank sums every rank's rows into .grad at the end of backward, divided by the group size,
  // after the parameter's all-reduce. With an untracked lookup of a tied table the table's bucket
  // then goes as soon as the head's gradient is in, beside the rest of backward, and only the
  // batch's rows (tokens x dim per rank) remain for the end. Every rank must look up the same number
  // of ids, and ids must be below 2^24 (they travel as float32). Without a synchronised backward
  // (noSync) the rows are summed into .grad as usual. Not with onBucketReduced. A group of one:
  // nothing changes.
  bool gatherEmbeddingRows = false;
};

class Reducer;

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
  // backward that raised, it first completes that backward's collectives (see the contract).
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

  // Collective over `comm`: averages every parameter's .grad over the ranks now, outside any
  // backward, as a synchronised backward's end would (all buckets, in order; a parameter
  // without .grad contributes zeros and gets the average). For gradients finished after the
  // backward that DDP's hooks see: a zero-bubble pipeline's deferred weight-gradient passes
  // (pipeline/schedule.h, ZB-H1) run the last backward under noSync() and call this after the
  // step. No overlap with backward. On CUDA the caller's stream waits for the all-reduces.
  // onBucketReduced runs for every bucket. Buckets are not rebuilt by it. Raises when called
  // inside a synchronised backward.
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
