// FullyShardedDataParallel: the backward pass (pre-backward hooks, gradients reduce-scattered as
// units complete, drained into the fp32 grad shards; contract in fsdp.h).
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_map>

#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "kernels/bucket_copy.h"
#include "parallel/data_parallel/fsdp/hooks.h"
#include "parallel/data_parallel/fsdp/prefetch.h"
#include "parallel/data_parallel/fsdp/impl.h"
#include "parallel/data_parallel/fsdp/unit_state.h"

namespace tessera {
namespace fsdp {
// Adds the unit's (completed) reduce-scatter output into its fp32 grad shard, taking the output
// itself as the shard when there is none yet (the first backward after zeroGrad).
void addIntoGrad(Unit& x) {
  torch::NoGradGuard ng;
  adoptViewGrads(x);
  auto out = x.rsOut.to(at::kFloat);
  if (x.grad.defined()) {
    x.grad.add_(out);
  } else {
    x.grad = out;  // rsOut itself (fp32), or its fresh fp32 copy
  }
  x.rsOut = at::Tensor();
  publishViewGrads(x);
}
}  // namespace fsdp

using fsdp::Unit;

namespace {
// Reduce-scatter inputs left in flight when the next unit's gradients are flattened
// (releaseReduceInputs).
constexpr size_t kReduceInputsInFlight = 1;
}  // namespace

// ---- backward

// A unit that ran more often in the forward a backward goes through than another unit (a root
// holding the embedding and the head, run at both ends of the forward) while resharding after
// forward was all-gathered for each run; its backward then keeps it gathered from its first
// pre-backward hook to its last gradient anyway. Counted by pre-backward hooks of one backward,
// so forwards of micro-batches whose backwards come later (pipelines: F0 F1 B0, interleaved
// stages) do not count as repeats. Warned once per unit.
void FullyShardedDataParallel::Impl::warnRepeatedRuns() {
  int fewest = 0;
  for (const auto& x : units_) {
    if (x->bwdRuns > 0) fewest = fewest == 0 ? x->bwdRuns : std::min(fewest, x->bwdRuns);
  }
  for (size_t v = 0; v < units_.size(); ++v) {
    auto& x = *units_[v];
    if (!x.reshardAfterForward || x.warnedRerun || x.bwdRuns <= fewest) continue;
    x.warnedRerun = true;
    log::warn("FullyShardedDataParallel: unit {} ('{}') ran {} times in the forward this backward went through, more "
              "often than other units ({}), with reshardAfterForward true: it is all-gathered again for every run. "
              "Give it reshardAfterForward = false (FsdpUnitSpec; as the Python wrapper does for its root unit) to "
              "gather it once per forward. (Warned once per unit.)",
              v, x.name, x.bwdRuns, fewest);
  }
}

void FullyShardedDataParallel::Impl::beginBackward() {
  if (inBackward_) return;
  inBackward_ = true;
  backwardOrder_.assign(passOrder_.rbegin(), passOrder_.rend());
  // The order agreed after the first synchronised backward (gatherEmbeddingRows), when this pass
  // runs the same units.
  if (!agreedOrder_.empty() && std::is_permutation(agreedOrder_.begin(), agreedOrder_.end(), backwardOrder_.begin(),
                                                   backwardOrder_.end())) {
    backwardOrder_ = agreedOrder_;
  }
  nextLaunch_ = 0;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalizeBackward(); });
}

void FullyShardedDataParallel::Impl::onPreBackward(int u) {
  beginBackward();
  auto& x = *units_[u];
  x.ranWithGrad = true;
  x.liveGraphs = std::max(0, x.liveGraphs - 1);
  x.bwdRuns += 1;
  // Every trainable parameter's gradient was complete and reduce-scattered already (a root whose
  // tied table's lookup, untracked, comes after its head: gatherEmbeddingRows): no backward op left
  // reads its values, so it is not gathered again.
  if (x.launched) return;
  gather(u, false);
  if (!x.bwdPrefetched) prefetchAfter(backwardOrder_, u);  // once per unit and backward
  x.bwdPrefetched = true;
  waitGathered(u);
}

void FullyShardedDataParallel::Impl::onGradReady(int u, int param) {
  beginBackward();
  auto& x = *units_[u];
  TESSERA_CHECK(!x.gotGrad[param],
                "FullyShardedDataParallel: parameter '{}' of unit '{}' got its gradient twice in one backward on rank "
                "{} (reentrant backward or retain_graph re-run?)",
                x.names[param], x.name, world_->rank());
  x.gotGrad[param] = true;
  if (--x.pending == 0) {
    x.gradsReady = true;
    readyOrder_.push_back(u);
    launchReady();
  }
}

void FullyShardedDataParallel::Impl::launchReady() {
  while (nextLaunch_ < backwardOrder_.size()) {
    const int u = backwardOrder_[nextLaunch_];
    auto& x = *units_[u];
    if (x.trainable > 0 && x.ranWithGrad && !x.gradsReady) break;
    ++nextLaunch_;
    if (x.trainable > 0 && x.ranWithGrad) processGrads(u);
  }
}

void FullyShardedDataParallel::Impl::processGrads(int u) {
  auto& x = *units_[u];
  const auto& l = x.layout;
  x.launched = true;
  torch::NoGradGuard ng;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> offs;
  for (const auto& e : l.entries) {
    if (!e.trainable) continue;
    auto& p = x.params[e.index];
    const auto& g = p.grad();
    if (g.defined()) {
      grads.push_back(g.is_contiguous() ? g : g.contiguous());
      offs.push_back(e.offset);
    }
  }
  auto f32 = x.master.options();
  const double scale = 1.0 / world_->size();
  // Later micro-batches add their gradients into the accumulation in place, one add per tensor
  // (float32 a + float(g): what adding a flattened copy gave, without the copy and its zeros).
  auto addIntoAccum = [&] {
    for (size_t i = 0; i < grads.size(); ++i) x.accum.narrow(0, offs[i], grads[i].numel()).add_(grads[i].view(-1));
  };
  if (!sync_) {
    if (x.accum.defined()) {
      addIntoAccum();
    } else {
      x.accum = at::zeros({l.paddedNumel}, f32);
      kernels::flattenScaleCast(grads, x.accum, offs, 1.0);
    }
  } else {
    releaseReduceInputs(kReduceInputsInFlight);  // their memory goes to this unit's input
    at::Tensor flat;
    if (x.accum.defined()) {
      addIntoAccum();
      flat = x.accum.mul_(scale).to(opts_.reduceDtype);  // fp32: the accumulation itself
      x.accum = at::Tensor();
    } else {
      flat = at::zeros({l.paddedNumel}, f32.dtype(opts_.reduceDtype));
      kernels::flattenScaleCast(grads, flat, offs, scale);
    }
    if (shardComm_->size() == 1) {
      // A group of one: the input is the output (no second unit-sized buffer and no copy; addIntoGrad
      // then adopts it as the grad shard when there is none yet).
      x.rsOut = flat.narrow(0, 0, l.shardNumel);
    } else {
      x.rsOut = at::empty({l.shardNumel}, f32.dtype(opts_.reduceDtype));
      x.rsWork = shardComm_->reduceScatter(x.rsOut, flat, ReduceOp::Sum, Keep::ByCaller);
      reduceIns_.emplace_back(flat, x.rsWork);
    }
    stats_.reduceScatters += 1;
    if (!replicaComm_) drainReduceScatters(u);
  }
  for (auto& p : x.params) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
  if (!x.hasFrozen) keepOrReshard(u);
}

// Frees the reduce-scatter inputs whose op has completed (a query, no wait) and, beyond `keep` still
// in flight, the oldest once the current stream has waited for its op (no host wait): the caching
// allocator then hands their blocks to later allocations on this stream. The communication stream
// runs the all-gathers prefetched for backward in between the reduce-scatters, so waiting for the
// newest reduce-scatter made compute wait for those gathers too (1.35 ms a step on llama3-1b over
// 4 H200s: profile_llama3_1b_4gpu_h200.md, in git history); keeping one input in flight avoids that
// at the cost of one more unit-sized float32 buffer.
void FullyShardedDataParallel::Impl::releaseReduceInputs(size_t keep) {
  while (!reduceIns_.empty()) {
    auto& [input, work] = reduceIns_.front();
    if (reduceIns_.size() > keep) {
      work->wait();
    } else if (!work->completed()) {
      break;  // ops complete in order: the later ones are still running too
    }
    reduceIns_.pop_front();
  }
}

// Adds the reduce-scatter outputs of units launched before `current` into their grad shards as
// soon as they are complete (no host wait), and waits (stream-ordered) for all but the newest
// kMaxUndrained, so at most that many fp32 output shards are alive at once instead of one per
// unit until the end of backward. Plain FSDP only: hybrid sharding all-reduces the outputs
// across replicas first, in finalizeBackward.
void FullyShardedDataParallel::Impl::drainReduceScatters(int current) {
  constexpr int kMaxUndrained = 2;
  std::vector<int> open;
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (u != current && x.launched && x.rsOut.defined()) open.push_back(u);
  }
  for (size_t i = 0; i < open.size(); ++i) {
    auto& x = *units_[open[i]];
    const bool mustWait = static_cast<int>(open.size() - i) > kMaxUndrained;
    if (x.rsWork && !mustWait && !x.rsWork->completed()) continue;
    if (x.rsWork) x.rsWork->wait();
    fsdp::addIntoGrad(x);
    x.rsWork.reset();
  }
}

void FullyShardedDataParallel::Impl::finalizeBackward() {
  // Units whose trainable parameters did not all get a gradient: launch now (zeros for those).
  for (int u : backwardOrder_) units_[u]->gradsReady = true;
  launchReady();
  std::vector<WorkPtr> replicaWorks;
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (!x.launched || !sync_ || !x.rsOut.defined()) continue;  // undefined: drained during backward
    if (x.rsWork) x.rsWork->wait();
    if (replicaComm_) replicaWorks.push_back(replicaComm_->allReduce(x.rsOut, ReduceOp::Sum));
  }
  for (auto& w : replicaWorks) w->wait();
  releaseReduceInputs(0);
  for (int u : backwardOrder_) {
    auto& x = *units_[u];
    if (x.launched && sync_ && x.rsOut.defined()) fsdp::addIntoGrad(x);  // addIntoGrad runs without grad mode
  }
  if (sync_) addGatheredRows();
  if (sync_ && opts_.gatherEmbeddingRows && agreedOrder_.empty()) agreeReduceOrder();
  for (size_t v = 0; v < units_.size(); ++v) keepOrReshard(static_cast<int>(v));
  warnRepeatedRuns();
  plannedOrder_ = passOrder_;
  resetPass();
}

void FullyShardedDataParallel::Impl::resetPass() {
  for (auto& x : units_) {
    x->ranWithGrad = x->liveGraphs > 0;  // forwards whose backward is still to come
    x->bwdPrefetched = false;
    x->bwdRuns = 0;
    std::fill(x->gotGrad.begin(), x->gotGrad.end(), false);
    x->pending = x->trainable;
    x->gradsReady = x->launched = false;
    x->rsWork.reset();
    x->rsOut = at::Tensor();
  }
  inBackward_ = false;
  passOpen_ = false;
  nextLaunch_ = 0;
  readyOrder_.clear();
}

}  // namespace tessera
