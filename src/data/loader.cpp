#include "tessera/data/loader.h"

#include <ATen/ATen.h>

#include "tessera/common/device.h"
#include "tessera/common/error.h"

namespace tessera::data {

BatchLoader::BatchLoader(std::shared_ptr<const Blend> data, LoaderOptions o, int64_t first)
    : data_(std::move(data)), o_(o), next_(first) {
  TESSERA_CHECK(o_.rows >= 1 && o_.rowBegin >= 0 && o_.rowBegin + o_.rows <= o_.globalBatch && o_.depth >= 1,
                "tessera data: loader rows [{}, {}) of a global batch of {} (depth {})", o_.rowBegin,
                o_.rowBegin + o_.rows, o_.globalBatch, o_.depth);
  // CUDA is initialised here, on the caller's thread, before the worker's first pinned
  // allocation (which would otherwise initialise it from the worker).
  if (o_.device.is_cuda()) at::empty({0}, at::TensorOptions().device(o_.device));
  thread_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchLoader::run() {
  useDevice(o_.device);  // the worker's current CUDA device: the one it prepares batches for
  const auto opts = at::TensorOptions().dtype(at::kLong).pinned_memory(o_.device.is_cuda());
  for (;;) {
    int64_t first;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < o_.depth; });
      if (stop_) return;
      first = next_;
      next_ += o_.globalBatch;
    }
    try {
      auto buf = at::empty({o_.rows, data_->seqLen() + 1}, opts);
      readSamples(*data_, first + o_.rowBegin, o_.rows, o_.vocab, buf);
      TokenBatch b{buf, {}};
      if (!o_.device.is_cuda()) {  // the split and copies here, off the trainer's thread
        b = splitSamples(buf);
        b = {b.tokens.contiguous(), b.targets.contiguous()};
      }
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      stop_ = true;
    }
    cv_.notify_all();
  }
}

TokenBatch BatchLoader::next() {
  TokenBatch b;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);
    b = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_all();
  if (!o_.device.is_cuda()) return b;
  b = splitSamples(b.tokens.to(o_.device, /*non_blocking=*/true));
  return {b.tokens.contiguous(), b.targets.contiguous()};
}

}  // namespace tessera::data
