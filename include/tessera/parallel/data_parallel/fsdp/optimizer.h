#pragma once
// ShardedAdamW: AdamW over FSDP's flat fp32 master shards. Each rank keeps the optimizer
// state (exp_avg, exp_avg_sq) only for the trainable elements of its shards (frozen
// parameters and padding are never stepped), so with the same gradients the result equals
// torch::optim::AdamW on the unsharded parameters element for element.
//
// Contract: step() and zeroGrad() are local (step() is collective with gatherAfterStep); call step() after backward (and after
// fsdp.clipGradNorm if clipping) on every rank. Parameters whose gradient was zero are still
// stepped (momentum and weight decay apply), unlike torch's AdamW, which skips parameters with
// no gradient at all. The FSDP object must outlive the optimizer.
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tessera/optim/adamw.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"

namespace tessera {


class ShardedAdamW {
 public:
  // `decays(name)`: whether the parameter of that (FSDP entry) name takes weight decay;
  // unset: every parameter does. Each shard is stepped in runs of equal decay.
  using DecayRule = std::function<bool(const std::string&)>;
  ShardedAdamW(FullyShardedDataParallel& fsdp, AdamWOptions options = {}, DecayRule decays = nullptr);

  // Every run of every unit in one multi-tensor AdamW (kernels/multi_tensor_adamw.h: a few
  // launches on CUDA, bitwise the per-tensor kernel); with FsdpOptions::gatherAfterStep, in two:
  // the next forward's leading units, then (after their all-gathers are issued: collective over
  // the shard group) the rest. gradScale: as optim::AdamW::step's (clipping's coefficient on the
  // device, applied as the gradients are read).
  void step(const at::Tensor& gradScale = {});
  void zeroGrad() { fsdp_.zeroGrad(); }
  int64_t steps() const { return step_; }
  AdamWOptions& options() { return opts_; }

  // Local: "<unit>.exp_avg", "<unit>.exp_avg_sq" (this rank's shard state) and "step".
  std::map<std::string, at::Tensor> stateDict() const;
  // Local: what stateDict saved on the same shard rank (tessera::Error naming the key otherwise).
  void loadStateDict(const std::map<std::string, at::Tensor>& sd);

 private:
  FullyShardedDataParallel& fsdp_;
  AdamWOptions opts_;
  std::vector<at::Tensor> expAvg_, expAvgSq_;
  struct Run {
    int64_t begin, end;  // within this rank's shard
    bool decay;
  };
  std::vector<std::vector<Run>> runs_;  // per unit, covering its trainable shard elements
  int64_t step_ = 0;
};

}  // namespace tessera
