#pragma once
// Reducer: DDP's engine room (internal). Owns the buckets, the autograd hooks on each
// parameter's gradient accumulator, the end-of-backward step (reducer_end.cpp) and the gathered
// embedding rows (reducer_rows.cpp). See ddp.h for the contract.
//
// Flow of one synchronised backward:
//   hook(i) fires after param i's .grad was accumulated → mark ready; when bucket b has all
//   its gradients, and every bucket before it has been launched, launch b: copy + scale
//   (1/world) + cast the gradients into the flat bucket (kernels::flattenScaleCast) and
//   all-reduce(sum) it — or, with bucket views, all-reduce(avg) the bucket in place.
//   Buckets launch in index order on every rank, so collectives match across ranks.
//   The first hook queues finalize() on the autograd engine: it handles parameters that got
//   no gradient, launches what is left, waits on every bucket (CUDA: stream-ordered), copies
//   back (kernels::unflattenCast) and, after the first iteration, rebuilds the buckets in
//   the order rank 0 saw gradients become ready (completeIteration()). Every rank issues
//   the same collectives however its backward went: parameters without a gradient still
//   contribute (their .grad, or zeros), and the "got no gradient" error is raised after.
//   A backward that raised before finalize() (a hook, onBucketReduced, the model's own
//   backward) drops finalize's callback with its graph task, which expires the iteration's
//   token: the next zeroGrad() or synchronised backward's first hook sees that, waits for
//   the dropped iteration's all-reduces, issues the rest on zeros (finishAbortedIteration(),
//   .grad untouched) and starts clean.
//   From the first launch to finalize(), options.smCarveout SMs are kept free of GEMMs
//   (common/sm_carveout.h), so backward's GEMMs fit beside the running all-reduces.
//   With onBucketReduced, each launched bucket is handed to it at once (afterReduce): on CUDA
//   on a side stream that waits for the all-reduce (and copies the bucket back into .grad
//   first when gradients are not bucket views); finalize() makes the caller's stream wait
//   for the side stream.
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/sm_carveout.h"
#include "parallel/data_parallel/ddp/ddp.h"
#include "parallel/data_parallel/gathered_rows.h"

namespace torch::autograd {
struct Node;
}

namespace tessera {

class Reducer {
 public:
  Reducer(DistributedDataParallel::Named params, CommPtr comm, DdpOptions opts);
  ~Reducer();

  void setSync(bool on) { sync_ = on; }
  bool sync() const { return sync_; }
  void zeroGrad();
  void reduceNow();  // DistributedDataParallel::reduceGradients (reducer_end.cpp)
  std::vector<std::vector<std::string>> layout() const;
  const DdpOptions& options() const { return opts_; }
  const CommPtr& comm() const { return comm_; }

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    int bucket = -1;
    bool ready = false;
  };
  struct Bucket {
    std::vector<int> params;
    std::vector<int64_t> offsets;
    at::Tensor flat;
    int pending = 0;
    WorkPtr work;  // null in a group of one
  };

  void build(const std::vector<int>& order);
  void onGradReady(int i);
  void launchReady();
  void launch(Bucket& b);
  void afterReduce(Bucket& b);
  void unflatten(Bucket& b, const std::vector<bool>& globallyUnused);
  void finalize();
  std::vector<int> completeIteration(bool deliver);
  // Waits for every bucket, copies the averages into .grad (deliver, not bucket views, not
  // handed over already) and orders the caller's stream after onBucketReduced's side stream.
  void awaitBuckets(bool deliver, const std::vector<bool>& globallyUnused);
  void finishAbortedIteration();
  void resetIteration();
  void beginIteration();  // with mu_ held: the first hook (or offered rows) of a synchronised backward
  // gatherEmbeddingRows (reducer_rows.cpp): the sinks on the parameters, the rows they took this
  // backward (all-gathers in flight), and their sum into .grad at the end of backward.
  struct ParamRows {
    int param;
    GatheredRows gathered;
  };
  void installRowSinks();
  void removeRowSinks();
  bool offerRows(int param, const at::Tensor& ids, const at::Tensor& rows);
  void addGatheredRows(bool deliver);
  std::optional<std::vector<int>> agreedReadyOrder(bool offer);
  bool viewMode() const { return opts_.gradientAsBucketView; }
  std::vector<at::Tensor> paramTensors() const;  // params_[i].tensor, in order

  std::vector<Param> params_;
  CommPtr comm_;
  DdpOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  std::vector<unsigned> tensorHooks_;  // overwriteStaleGrads: params_[i]'s hook before autograd adds
  bool rowSinks_ = false;
  std::vector<ParamRows> gathered_;
  std::mutex mu_;
  bool sync_ = true;
  bool inBackward_ = false;
  std::weak_ptr<void> iteration_;  // expires when the graph task holding finalize()'s callback ends
  bool discard_ = false;           // completing an aborted iteration: all-reduce zeros, deliver nothing
  size_t nextLaunch_ = 0;
  bool rebuilt_ = false;
  std::vector<int> readyOrder_;
  std::unique_ptr<SmCarveoutGuard> carveout_;  // while buckets are in flight in backward
  std::optional<c10::Stream> sideStream_;      // onBucketReduced's stream (CUDA)
};

}  // namespace tessera
