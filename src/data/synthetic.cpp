#include "tessera/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>

namespace tessera::data {

TokenBatch syntheticRows(uint64_t seed, int64_t step, int64_t globalBatch, int64_t first, int64_t rows, int64_t vocab,
                int64_t seqLen, at::Device device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 7919ull + static_cast<uint64_t>(step) * 104729ull + 1);
  // The whole global batch's (start, stride) pairs, so a row does not depend on who reads it.
  auto start = at::randint(0, vocab, {globalBatch, 1}, gen, at::kLong);
  auto stride = at::randint(1, 9, {globalBatch, 1}, gen, at::kLong);
  auto pos = at::arange(seqLen + 1, at::kLong).unsqueeze(0);
  auto seq = (start + stride * pos).remainder(vocab).narrow(0, first, rows);
  if (!device.is_cuda()) return {seq.narrow(1, 0, seqLen).contiguous(), seq.narrow(1, 1, seqLen).contiguous()};
  // From pinned memory, queued: the host does not wait for the device's earlier work.
  auto onDevice = seq.pin_memory().to(device, /*non_blocking=*/true);
  return {onDevice.narrow(1, 0, seqLen).contiguous(), onDevice.narrow(1, 1, seqLen).contiguous()};
}

}  // namespace tessera::data
