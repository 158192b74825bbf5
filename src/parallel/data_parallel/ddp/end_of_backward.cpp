// Reducer, the end of a synchronised backward (see reducer.h): finalize(), the completion of
// an aborted iteration, the bucket rebuild from rank 0's ready order, and reduceNow() (every
// bucket at once, outside backward).
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/ScopeExit.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "tessera/nn/stale_grads.h"
#include "parallel/data_parallel/ddp/buckets.h"
#include "parallel/data_parallel/ddp/reducer.h"

namespace tessera {

std::optional<std::vector<int>> Reducer::agreedReadyOrder(bool offer) {
  // Rank 0's ready order (then the parameters it saw no gradient for, last registered first)
  // after a flag: 1 when rank 0 offers it, 0 to keep the buckets for now. The same length on
  // every rank, whatever each rank saw; checked to be a permutation on every rank.
  const auto n = static_cast<int64_t>(params_.size());
  std::vector<int64_t> mine(n + 1, -1);
  if (comm_->rank() == 0) {
    std::vector<bool> seen(n, false);
    std::vector<int64_t> order = {offer ? 1 : 0};
    for (int i : readyOrder_) {
      order.push_back(i);
      seen[i] = true;
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      if (!seen[i]) order.push_back(i);
    }
    std::copy_n(order.begin(), std::min<size_t>(order.size(), mine.size()), mine.begin());
  }
  auto t = at::tensor(mine, at::kLong).to(params_[0].tensor.device());
  comm_->broadcast(t, 0)->synchronize();
  auto cpu = t.cpu();
  const int64_t* got = cpu.data_ptr<int64_t>();
  if (got[0] == 0) return std::nullopt;
  std::vector<int> order(got + 1, got + 1 + n);
  std::vector<std::string> names;
  for (const auto& p : params_) names.push_back(p.name);
  auto problem = ddp::orderProblem(order, params_.size(), names);
  if (!problem.empty()) {
    rebuilt_ = true;  // keep the current buckets from now on
    throw Error(fmt::format("DistributedDataParallel: on rank {}, the gradient-ready order from rank 0's first "
                            "backward is not a permutation of the {} parameters ({}); the buckets were not rebuilt "
                            "(this backward's gradients are averaged)",
                            comm_->rank(), n, problem));
  }
  return order;
}

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  auto reset = c10::make_scope_exit([this] { resetIteration(); });  // the next backward starts clean
  auto missing = completeIteration(/*deliver=*/true);
  if (!missing.empty() && !opts_.findUnusedParameters) {
    std::vector<std::string> names;
    for (int i : missing) names.push_back(params_[i].name);
    throw Error(fmt::format(
        "DistributedDataParallel: on rank {}, {} parameter(s) got no gradient in this backward: {}. Set "
        "findUnusedParameters if parts of the model are skipped on purpose, or set requires_grad=false on "
        "parameters that are never trained",
        comm_->rank(), names.size(), fmt::join(names, ", ")));
  }
}

std::vector<int> Reducer::completeIteration(bool deliver) {
  std::vector<int> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].ready) missing.push_back(static_cast<int>(i));
  }
  // Parameters without a gradient here contribute what they hold (zeros if nothing), so every
  // bucket is all-reduced on every rank, whether this rank raises afterwards or not.
  if (opts_.overwriteStaleGrads) {
    std::vector<at::Tensor> unwritten;
    for (int i : missing) unwritten.push_back(params_[i].tensor);
    nn::zeroIfStale(unwritten);  // what they hold is garbage while stale
  }
  for (int i : missing) {
    params_[i].ready = true;
    --buckets_[params_[i].bucket].pending;
  }
  launchReady();
  if (nextLaunch_ < buckets_.size()) {
    const auto& b = buckets_[nextLaunch_];
    std::vector<std::string> names;
    for (int i : b.params) names.push_back(params_[i].name);
    throw Error(fmt::format("DistributedDataParallel: internal error on rank {}: at the end of backward bucket {} of "
                            "{} ({}) still waits for {} gradient(s), so it and the buckets after it were never "
                            "all-reduced",
                            comm_->rank(), nextLaunch_, buckets_.size(), fmt::join(names, ", "), b.pending));
  }
  std::vector<bool> globallyUnused(params_.size(), false);
  if (opts_.findUnusedParameters) {
    std::vector<int32_t> used(params_.size(), 1);
    for (int i : missing) used[i] = 0;
    auto dev = at::tensor(used, at::kInt).to(params_[0].tensor.device());
    comm_->allReduce(dev, ReduceOp::Sum)->synchronize();
    auto cpu = dev.cpu();
    const int32_t* counts = cpu.data_ptr<int32_t>();  // one read, not a tensor per parameter
    for (size_t i = 0; i < params_.size(); ++i) globallyUnused[i] = counts[i] == 0;
  }
  awaitBuckets(deliver, globallyUnused);
  addGatheredRows(deliver && !discard_);
  if (opts_.rebuildBuckets && !rebuilt_) {
    // Rank 0 offers its order from a backward that went through, else the next one's is used.
    if (auto order = agreedReadyOrder(deliver && (missing.empty() || opts_.findUnusedParameters))) {
      build(*order);
      rebuilt_ = true;
    }
  }
  return missing;
}

void Reducer::reduceNow() {
  // Nothing to average (no buckets), unless stale gradients are to be resolved.
  if (comm_->size() == 1 && !opts_.onBucketReduced && !opts_.overwriteStaleGrads) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (inBackward_ && iteration_.expired()) finishAbortedIteration();
  TESSERA_CHECK(!inBackward_,
                "DistributedDataParallel::reduceGradients: called inside a synchronised backward on rank {} (use it "
                "after a backward run under noSync())",
                comm_->rank());
  inBackward_ = true;
  auto reset = c10::make_scope_exit([this] { resetIteration(); });
  if (opts_.overwriteStaleGrads) nn::zeroIfStale(paramTensors());  // nobody wrote them since zeroGrad()
  for (auto& p : params_) p.ready = true;
  for (auto& b : buckets_) b.pending = 0;
  launchReady();
  awaitBuckets(/*deliver=*/true, {});
}

void Reducer::awaitBuckets(bool deliver, const std::vector<bool>& globallyUnused) {
  for (auto& b : buckets_) {
    if (b.work) b.work->wait();
    // With onBucketReduced every bucket was copied back when it was handed over (afterReduce).
    if (!deliver || viewMode() || opts_.onBucketReduced || !b.work) continue;
    unflatten(b, globallyUnused);
  }
  if (sideStream_) {  // the caller's stream after onBucketReduced's work
    const auto dev = params_[0].tensor.device();
    c10::Event done(dev.type());
    done.record(*sideStream_);
    done.block(c10::impl::VirtualGuardImpl(dev.type()).getStream(dev));
  }
}

void Reducer::finishAbortedIteration() {
  const size_t started = nextLaunch_;
  discard_ = true;
  auto reset = c10::make_scope_exit([this] {
    discard_ = false;
    resetIteration();
  });
  try {
    completeIteration(/*deliver=*/false);
  } catch (const std::exception& e) {
    throw Error(fmt::format("DistributedDataParallel: on rank {}, the previous synchronised backward raised after {} "
                            "of {} bucket(s) had started their all-reduce; completing its collectives (so the ranks' "
                            "stay matched) failed: {}",
                            comm_->rank(), started, buckets_.size(), e.what()));
  }
}

void Reducer::resetIteration() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
  }
  nextLaunch_ = 0;
  readyOrder_.clear();
  gathered_.clear();
  inBackward_ = false;
  iteration_.reset();
  carveout_.reset();  // later GEMMs are stream-ordered after the all-reduces: all SMs again
}

}  // namespace tessera
