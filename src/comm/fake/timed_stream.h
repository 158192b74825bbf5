#pragma once
// Internal to the fake communicator: the stream its timed ops run on (fake_timing.h). CUDA builds
// (TESSERA_HAVE_NCCL) implement it in timed_stream.cpp / timed_kernel.cu; others throw.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "tessera/comm/types.h"
#include "tessera/comm/work.h"

namespace tessera::fake_detail {

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

class TimedStream {
 public:
  virtual ~TimedStream() = default;
  // Orders the stream after the caller's current stream, spins `seconds`, then runs `copies`
  // (device to device); returns the op's Work. `keep` is referenced until the op is seen complete.
  virtual WorkPtr run(const OpInfo& i, double seconds, const std::vector<Copy>& copies,
                      std::vector<at::Tensor> keep) = 0;
};

// A stream on CUDA device `device` whose spin kernel occupies `ctas` whole SMs (0: one small
// block); with `traffic` (ctas > 0) the kernel streams a 2 x 64 MiB scratch buffer instead of
// sleeping (timed_kernel.h). Throws in builds without CUDA.
std::shared_ptr<TimedStream> makeTimedStream(int device, int ctas, bool traffic = false);

}  // namespace tessera::fake_detail
