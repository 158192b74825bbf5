#pragma once
// Small device utilities for trainers and benchmarks (local, no communication).
// - useDevice: makes `d` the current CUDA device (nothing for the CPU).
// - synchronizeDevice: waits for all work queued on `d` (nothing for the CPU).
// - resetPeakMemory / peakMemoryGiB: CUDA: the caching allocator's peak of allocated bytes
//   since the last reset (what torch.cuda.max_memory_allocated reports). CPU: the process's
//   peak resident set size (getrusage; the reset does nothing).
// - allocatedMemoryGiB: CUDA: bytes allocated now (torch.cuda.memory_allocated); CPU: 0.
// - totalMemoryGiB: CUDA: the device's memory (cudaMemGetInfo's total); CPU: 0 (no budget known).
// - deviceName: CUDA: the card's name ("NVIDIA H200"); CPU: "CPU".
// CUDA needs a CUDA LibTorch (builds where TESSERA_TORCH_CUDA is set); otherwise a CUDA
// device is a tessera::Error.
#include <c10/core/Device.h>

#include <string>

namespace tessera {

void useDevice(const at::Device& d);
void synchronizeDevice(const at::Device& d);
void resetPeakMemory(const at::Device& d);
double peakMemoryGiB(const at::Device& d);
double allocatedMemoryGiB(const at::Device& d);
double totalMemoryGiB(const at::Device& d);
std::string deviceName(const at::Device& d);

}  // namespace tessera
