#include "parallel/data_parallel/ddp/reducer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "kernels/bucket_copy.h"
#include "tessera/nn/recompute.h"
#include "tessera/nn/stale_grads.h"
#include "parallel/data_parallel/ddp/buckets.h"

namespace tessera {

Reducer::Reducer(DistributedDataParallel::Named named, CommPtr comm, DdpOptions opts)
    : comm_(std::move(comm)), opts_(opts) {
  // DistributedDataParallel checked the parameters and options on every rank (validate.h):
  // some require a gradient, all of them contiguous floating-point leaves on one device.
  for (auto& [name, t] : named) {
    if (t.requires_grad()) params_.push_back(Param{name, t});
  }

  // A group of one: each gradient already is the average. No buckets, hooks or collectives
  // (but for onBucketReduced and overwriteStaleGrads: buckets and hooks without communication).
  if (comm_->size() == 1 && !opts_.onBucketReduced && !opts_.overwriteStaleGrads) return;

  std::vector<int> reverse(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) reverse[i] = static_cast<int>(params_.size() - 1 - i);
  build(reverse);

  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    TESSERA_CHECK(acc, "DistributedDataParallel: parameter '{}' is not a leaf with a gradient accumulator",
                  params_[i].name);
    int idx = static_cast<int>(i);
    auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, idx](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          onGradReady(idx);
          return outputs;
        }));
    hooks_.emplace_back(std::move(acc), key);  // also keeps the accumulator alive
    if (opts_.overwriteStaleGrads) {
      // Before autograd adds a gradient into a stale .grad: zero it (nn/stale_grads.h). Keyed by
      // the TensorImpl, not the tensor: the parameter must not own a hook that owns it.
      const c10::TensorImpl* self = params_[i].tensor.unsafeGetTensorImpl();
      tensorHooks_.push_back(params_[i].tensor.register_hook([self](const at::Tensor& g) {
        if (g.defined()) nn::zeroIfStale(self);
      }));
    }
  }
  if (opts_.gatherEmbeddingRows && comm_->size() > 1) installRowSinks();
}

Reducer::~Reducer() {
  removeRowSinks();
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
  for (size_t i = 0; i < tensorHooks_.size(); ++i) params_[i].tensor.remove_hook(tensorHooks_[i]);
  try {
    nn::zeroIfStale(paramTensors());  // no mark outlives the DDP that made it: .grad reads as zeroGrad() left it
  } catch (...) {
  }
}

std::vector<at::Tensor> Reducer::paramTensors() const {
  std::vector<at::Tensor> out;
  for (const auto& p : params_) out.push_back(p.tensor);
  return out;
}

void Reducer::build(const std::vector<int>& order) {
  std::vector<ddp::BucketParam> sizes;
  for (const auto& p : params_) {
    sizes.push_back({static_cast<size_t>(p.tensor.numel()) * p.tensor.element_size(),
                     static_cast<int>(p.tensor.scalar_type())});
  }
  auto groups = ddp::assignBuckets(order, sizes, opts_.bucketCapBytes, opts_.firstBucketCapBytes);
  std::vector<Bucket> buckets(groups.size());
  for (size_t b = 0; b < groups.size(); ++b) {
    auto& bk = buckets[b];
    bk.params = groups[b];
    int64_t total = 0;
    for (int i : bk.params) {
      bk.offsets.push_back(total);
      params_[i].bucket = static_cast<int>(b);
      total += params_[i].tensor.numel();
    }
    const auto& first = params_[bk.params[0]].tensor;
    bk.flat = at::zeros({total}, first.options().dtype(opts_.commDtype.value_or(first.scalar_type())));
    bk.pending = static_cast<int>(bk.params.size());
    if (viewMode()) {
      // Gradients become views of the bucket (keeping what they held so far).
      for (size_t k = 0; k < bk.params.size(); ++k) {
        auto& p = params_[bk.params[k]];
        auto view = bk.flat.narrow(0, bk.offsets[k], p.tensor.numel()).view(p.tensor.sizes());
        if (p.tensor.grad().defined()) view.copy_(p.tensor.grad());
        p.tensor.mutable_grad() = view;
      }
    }
  }
  buckets_ = std::move(buckets);
}

std::vector<std::vector<std::string>> Reducer::layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

void Reducer::zeroGrad() {
  {
    // After a backward that raised: its all-reduces may still write into the gradients
    // (bucket views); complete them first.
    std::lock_guard<std::mutex> lock(mu_);
    if (inBackward_ && iteration_.expired()) finishAbortedIteration();
  }
  if (opts_.overwriteStaleGrads) {  // the first writer replaces them (nn/stale_grads.h)
    nn::markStale(paramTensors());
    return;
  }
  nn::zeroGrads(paramTensors());
}

void Reducer::beginIteration() {
  // The last backward that reached a hook ended without finalize(): it raised.
  if (inBackward_ && iteration_.expired()) finishAbortedIteration();
  if (inBackward_) return;
  inBackward_ = true;
  auto token = std::make_shared<bool>();  // lives as long as the callback, i.e. the graph task
  iteration_ = token;
  // At the end of the whole backward, also when this hook runs inside a recomputation's nested
  // backward (recompute full: a pipeline stage whose first gradients come from a block).
  nn::queueAtBackwardEnd([this, token] { finalize(); });
}

void Reducer::onGradReady(int i) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  beginIteration();
  auto& p = params_[i];
  if (opts_.overwriteStaleGrads) nn::zeroIfStale(p.tensor);  // still stale: nothing wrote it
  TESSERA_CHECK(!p.ready,
                "DistributedDataParallel: parameter '{}' got its gradient twice in one backward on rank {} (reentrant "
                "backward or a parameter used by two graphs?); use noSync() for all but one",
                p.name, comm_->rank());
  p.ready = true;
  if (opts_.rebuildBuckets && !rebuilt_) readyOrder_.push_back(i);
  if (--buckets_[p.bucket].pending == 0) launchReady();
}

void Reducer::launchReady() {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) launch(buckets_[nextLaunch_++]);
}

void Reducer::launch(Bucket& b) {
  const bool alone = comm_->size() == 1;
  if (discard_) {  // completing an aborted iteration: its collective only, on zeros; .grad untouched
    if (!alone) b.work = comm_->allReduce(at::zeros_like(b.flat), viewMode() ? ReduceOp::Avg : ReduceOp::Sum);
    return;
  }
  if (!carveout_ && opts_.smCarveout > 0 && !alone) carveout_ = std::make_unique<SmCarveoutGuard>(opts_.smCarveout);
  if (viewMode()) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      auto& p = params_[b.params[k]];
      auto view = b.flat.narrow(0, b.offsets[k], p.tensor.numel());
      const auto& g = p.tensor.grad();
      if (g.defined() && g.data_ptr() == view.data_ptr()) continue;
      // The gradient was replaced (e.g. set to None by an optimizer): back into the bucket.
      if (g.defined()) {
        view.copy_(g.reshape({-1}));
      } else {
        view.zero_();
      }
      p.tensor.mutable_grad() = view.view(p.tensor.sizes());
    }
    if (!alone) b.work = comm_->allReduce(b.flat, ReduceOp::Avg);
  } else if (!alone) {
    std::vector<at::Tensor> srcs;
    std::vector<int64_t> offs;
    for (size_t k = 0; k < b.params.size(); ++k) {
      const auto& g = params_[b.params[k]].tensor.grad();
      if (g.defined()) {
        srcs.push_back(g.is_contiguous() ? g : g.contiguous());
        offs.push_back(b.offsets[k]);
      } else {  // no gradient on this rank (findUnusedParameters): contributes zeros
        b.flat.narrow(0, b.offsets[k], params_[b.params[k]].tensor.numel()).zero_();
      }
    }
    kernels::flattenScaleCast(srcs, b.flat, offs, 1.0 / comm_->size());
    b.work = comm_->allReduce(b.flat, ReduceOp::Sum);
  }
  if (opts_.onBucketReduced) afterReduce(b);
}

void Reducer::afterReduce(Bucket& b) {
  std::vector<at::Tensor> ps;
  for (int i : b.params) ps.push_back(params_[i].tensor);
  auto hand = [&] {
    if (b.work) b.work->wait();
    if (!viewMode() && b.work) unflatten(b, {});
    opts_.onBucketReduced(ps);
  };
  const auto dev = params_[0].tensor.device();
  if (!dev.is_cuda()) {  // CPU ops are synchronous: wait() returns once the all-reduce is done
    hand();
    return;
  }
  // On a side stream, ordered after the caller's stream so far (the bucket's copies, or the
  // gradients themselves in a group of one), then after the all-reduce.
  c10::impl::VirtualGuardImpl impl(dev.type());
  if (!sideStream_) sideStream_ = impl.getStreamFromGlobalPool(dev, /*isHighPriority=*/false);
  c10::Event ordered(dev.type());
  ordered.record(impl.getStream(dev));
  ordered.block(*sideStream_);
  c10::StreamGuard onSide(*sideStream_);
  hand();
}

void Reducer::unflatten(Bucket& b, const std::vector<bool>& globallyUnused) {
  std::vector<at::Tensor> dsts;
  std::vector<int64_t> offs;
  for (size_t k = 0; k < b.params.size(); ++k) {
    auto& p = params_[b.params[k]];
    if (!globallyUnused.empty() && globallyUnused[b.params[k]]) continue;  // nobody had a gradient: .grad as it was
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::empty_like(p.tensor);
    dsts.push_back(p.tensor.grad());
    offs.push_back(b.offsets[k]);
  }
  kernels::unflattenCast(b.flat, dsts, offs);
}

}  // namespace tessera
