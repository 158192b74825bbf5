#pragma once
// AdamW over a list of whole (unflattened) parameters with tessera's AdamW kernel
// (kernels/adamw.h: one fused kernel per tensor on CUDA, the ATen reference on the CPU), the
// same update ShardedAdamW applies to FSDP's flat shards, so DDP and FSDP runs of train_gpt
// step identically. State is allocated at construction (zeros) so checkpoints can address it
// before the first step. Every parameter is stepped, also with a zero gradient; a parameter
// without .grad is an error naming its index. Local; not thread-safe.
#include <ATen/core/Tensor.h>

#include <vector>

#include "sharding/fsdp/optimizer.h"

namespace tessera::gpt {

class ParamAdamW {
 public:
  ParamAdamW(std::vector<at::Tensor> params, AdamWOptions o);
  void step();
  int64_t steps() const { return step_; }
  void setSteps(int64_t s) { step_ = s; }
  // expAvg()[i], expAvgSq()[i]: state of params[i] (same shape, fp32).
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<at::Tensor>& expAvg() const { return m_; }
  const std::vector<at::Tensor>& expAvgSq() const { return v_; }

 private:
  std::vector<at::Tensor> params_, m_, v_;
  AdamWOptions o_;
  int64_t step_ = 0;
};

}  // namespace tessera::gpt
