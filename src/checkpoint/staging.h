#pragma once
// Internal to src/checkpoint: copies of tensors in host memory for a save that writes them later
// (async_save.h), without stopping the device. Local.
// - CPU tensors are cloned: done when copy() returns.
// - CUDA tensors are copied into pinned host memory on a side stream that first waits for the
//   caller's current stream (so the copies see every update queued before the save). Nothing
//   waits on the host. The sources stay referenced until the copies are done.
//   orderAfterCopies() makes the caller's current stream wait for the copies (call it before
//   anything overwrites the sources, e.g. the next optimizer step); waitCopies() blocks the
//   calling thread (the writer) until they are done. Both may be called from any thread, each
//   any number of times.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace tessera::checkpoint {

class HostStage {
 public:
  HostStage();
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

  // Host tensors (contiguous, same dtype and shape) that will hold `src`'s values.
  std::vector<at::Tensor> copy(const std::vector<at::Tensor>& src);
  void orderAfterCopies();
  void waitCopies();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::checkpoint
