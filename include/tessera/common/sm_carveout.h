#pragma once
// SMs left free for communication while GEMMs run beside it.
//
// A collective kernel (NCCL) on the communicator's stream takes some of the GPU's SMs. A GEMM
// launched beside it on the compute stream is sized by cuBLAS for all SMs; the blocks that do
// not fit run as a second wave, so a GEMM overlapping a collective can take up to twice as
// long, which eats most of what the overlap was meant to save. ATen can make cuBLASLt target
// fewer SMs (its "SM carveout"); while a carveout is active tessera also routes ATen's GEMMs
// through cuBLASLt, since ATen applies the carveout only there.
//
// Contract:
// - Process-wide (ATen's global context): it affects every thread's GEMMs (the autograd
//   engine's backward threads included) while active. Guards nest; each restores what it found.
// - A no-op where ATen has no carveout (LibTorch < 2.7, CPU-only builds, CPU tensors).
// - The amount comes from the caller (DdpOptions::smCarveout, tp::LinearOverlap::smCarveout).
#include <optional>

namespace tessera {

// Whether this build can apply a carveout (LibTorch >= 2.7 with CUDA).
bool smCarveoutSupported();

// While alive and sms > 0: ATen's GEMMs target (SM count − sms) SMs, through cuBLASLt.
class SmCarveoutGuard {
 public:
  explicit SmCarveoutGuard(int sms);
  ~SmCarveoutGuard();
  SmCarveoutGuard(const SmCarveoutGuard&) = delete;
  SmCarveoutGuard& operator=(const SmCarveoutGuard&) = delete;

 private:
  bool active_ = false;
  std::optional<int> prevCarveout_;
  int prevBackend_ = 0;
};

}  // namespace tessera
