#pragma once
// Work: the handle of one asynchronous communication op.
//
// Contract:
// - wait(): CPU (Gloo): blocks the calling thread until the op has finished, or throws
//   tessera::CommError when it failed or did not finish within the communicator's timeout.
//   CUDA (NCCL): makes the caller's *current stream* wait on the op's completion event and
//   returns at once (no host synchronisation); throws if the op is already known to have failed.
// - synchronize(): blocks the host until the op is finished (both backends), with the same
//   timeout and errors as wait().
// - completed(): non-blocking poll; true once the op finished (successfully or not).
// Tensors passed to the op stay referenced by the communicator until the op has completed on
// the device, so callers may drop their references right after issuing the op — unless the
// op was issued with Keep::ByCaller (types.h), where keeping them is the caller's job.
#include <memory>

#include "tessera/comm/types.h"

namespace tessera {

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual void synchronize() = 0;
  virtual bool completed() = 0;
  const OpInfo& info() const { return info_; }

 protected:
  explicit Work(OpInfo info) : info_(std::move(info)) {}
  OpInfo info_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace tessera
