// Builds without CUDA: the fake communicator cannot be timed.
#include "comm/fake/timed_stream.h"

#include "tessera/common/error.h"

namespace tessera::fake_detail {

std::shared_ptr<TimedStream> makeTimedStream(int, int, bool) {
  throw Error("fake communicator: timing needs a CUDA device and a build with CUDA (this one has none)");
}

}  // namespace tessera::fake_detail
