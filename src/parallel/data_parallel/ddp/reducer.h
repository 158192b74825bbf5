#pragma once
// Reducer: DDP's engine room (internal; ddp.h has the contract, docs/design/ddp.md the flow of a
// backward). Owns the buckets, the autograd hooks on each parameter's gradient accumulator, the
// end-of-backward step (end_of_backward.cpp) and the gathered embedding rows (embedding_rows.cpp).
// - hook(i) marks param i ready; a bucket whose gradients are all ready launches once every bucket
//   before it has: flattened, scaled and cast, then all-reduced on the communicator's stream.
//   Buckets launch in index order on every rank, so the collectives match.
// - The first hook queues finalize() (nn::queueAtBackwardEnd): unused parameters, the rest of the
//   launches, the waits, the copy back into .grad, and after the first iteration the rebuild.
// - A backward that raised expires the iteration's token; the next zeroGrad() or first hook then
//   completes that iteration's collectives on zeros (finishAbortedIteration) and starts clean.
// Guarded by mu_ (hooks run on the autograd engine's threads); one backward at a time.
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/common/sm_carveout.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
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
  void reduceNow();  // DistributedDataParallel::reduceGradients (end_of_backward.cpp)
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
  // gatherEmbeddingRows (embedding_rows.cpp): the sinks on the parameters, the rows they took this
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
