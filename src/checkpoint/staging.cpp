#include "checkpoint/staging.h"

#include <ATen/ATen.h>

#include <mutex>
#include <optional>

#include "tessera/common/error.h"

#ifdef TESSERA_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::checkpoint {

struct HostStage::Impl {
  std::mutex mu;
  std::vector<at::Tensor> sources;  // CUDA sources, alive until their copies are done
#ifdef TESSERA_TORCH_CUDA
  std::optional<at::cuda::CUDAEvent> done;
#endif
};

HostStage::HostStage() : impl_(std::make_unique<Impl>()) {}
HostStage::~HostStage() = default;

std::vector<at::Tensor> HostStage::copy(const std::vector<at::Tensor>& src) {
  std::vector<at::Tensor> out;
  out.reserve(src.size());
  bool cuda = false;
  for (const auto& t : src) {
    if (!t.is_cuda()) {
      out.push_back(t.detach().contiguous().clone());
    } else {
      cuda = true;
      out.emplace_back();  // filled below
    }
  }
  if (!cuda) return out;
#ifdef TESSERA_TORCH_CUDA
  std::lock_guard<std::mutex> l(impl_->mu);
  TESSERA_CHECK(!impl_->done, "checkpoint: HostStage::copy called twice");
  const auto device = [&] {
    for (const auto& t : src) {
      if (t.is_cuda()) return t.device();
    }
    return at::Device(at::kCUDA, 0);
  }();
  auto current = c10::cuda::getCurrentCUDAStream(device.index());
  auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    at::NoGradGuard ng;
    for (size_t k = 0; k < src.size(); ++k) {
      if (!src[k].is_cuda()) continue;
      TESSERA_CHECK(src[k].device() == device, "checkpoint: pieces on two CUDA devices ({} and {})",
                    src[k].device().str(), device.str());
      auto host = at::empty(src[k].sizes(), src[k].options().device(at::kCPU).pinned_memory(true));
      host.copy_(src[k].detach(), /*non_blocking=*/true);
      out[k] = host;
      impl_->sources.push_back(src[k]);
    }
  }
  impl_->done.emplace();
  impl_->done->record(side);
  return out;
#else
  throw Error("checkpoint: CUDA tensors given, but this tessera was built against a LibTorch without CUDA");
#endif
}

// `done` is set once, by copy(), before any other thread is given the stage; only read after.
void HostStage::orderAfterCopies() {
#ifdef TESSERA_TORCH_CUDA
  if (impl_->done) impl_->done->block(c10::cuda::getCurrentCUDAStream(impl_->done->device_index()));
#endif
}

void HostStage::waitCopies() {
#ifdef TESSERA_TORCH_CUDA
  if (impl_->done) impl_->done->synchronize();
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->sources.clear();
#endif
}

}  // namespace tessera::checkpoint
