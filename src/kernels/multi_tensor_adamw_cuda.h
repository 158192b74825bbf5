#pragma once
// Internal (kernels/ only): the launcher of the multi-tensor AdamW kernel in
// multi_tensor_adamw_cuda.cu (contract in multi_tensor_adamw.h). No torch and no CUDA type here.
#include <string>

#include "kernels/adamw_cuda.h"
#include "kernels/launch.h"

namespace tessera::kernels::detail {

constexpr int kMaxTensorsPerLaunch = 40;

// One tensor's update: device pointers of numel fp32 elements (copy: bf16, or null).
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  void* copy;
  long long numel;
  float decay;  // 1 - lr * weightDecay, or exactly 1 (no weight decay)
};

// Enqueues the updates of ts[0..count) (numel 0 skipped), at most kMaxTensorsPerLaunch per
// launch; gradScale: null, or a device float every gradient is multiplied by as it is read.
// Returns "" or the CUDA error text.
std::string launchMultiTensorAdamW(const AdamWTensor* ts, int count, const AdamWScalars& s, const Launch& l,
                                   const float* gradScale = nullptr);

}  // namespace tessera::kernels::detail
