#pragma once
// The benchmarks' optimizer, as the anchors' torch.optim.AdamW(lr=1e-4, fused=True): AdamW
// (decoupled weight decay 1e-2 on every parameter) through ATen's fused CUDA kernel
// (at::_fused_adamw_), one call over every parameter with a gradient. State (exp_avg, exp_avg_sq,
// float32 step on the device, incremented before the kernel) is allocated at the first step(), as
// PyTorch does. With LibTorch 1.13 (the CPU machine: smoke runs) the same update runs op by op.
// train_gpt steps with optim::AdamW instead (src/optim/adamw.h: per-tensor kernels, no decay on
// norms and biases). Local; not thread-safe.
#include <ATen/ATen.h>

#include <unordered_map>
#include <vector>

namespace tessera::bench {

class FusedAdamW {
 public:
  FusedAdamW(std::vector<at::Tensor> params, double lr = 1e-4, double beta1 = 0.9, double beta2 = 0.999,
             double eps = 1e-8, double weightDecay = 1e-2);
  void step();
  // Only `subset` (some of the constructor's parameters, by identity): DDP's onBucketReduced.
  // A tensor that is not one of them is a tessera::Error naming its shape.
  void step(const std::vector<at::Tensor>& subset);
  // setToNone: .grad reset (freed); else zeroed in place (keeps DDP bucket views).
  void zeroGrad(bool setToNone);

 private:
  void stepIndices(const std::vector<size_t>& which);
  std::vector<at::Tensor> params_, expAvg_, expAvgSq_, steps_;
  std::unordered_map<const void*, size_t> index_;
  double lr_, beta1_, beta2_, eps_, wd_;
};

}  // namespace tessera::bench
