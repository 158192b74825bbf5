#include "sharding/fsdp/optimizer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "common/error.h"

namespace tessera {

ShardedAdamW::ShardedAdamW(FullyShardedDataParallel& fsdp, AdamWOptions o) : fsdp_(fsdp), opts_(o) {
  for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
    const int64_t n = fsdp_.layout(u).trainableInShard(fsdp_.shardRank());
    expAvg_.push_back(at::zeros({n}, fsdp_.masterShard(u).options()));
    expAvgSq_.push_back(at::zeros({n}, fsdp_.masterShard(u).options()));
  }
}

void ShardedAdamW::step() {
  torch::NoGradGuard ng;
  ++step_;
  kernels::AdamWStep s{opts_.lr, opts_.beta1, opts_.beta2, opts_.eps, opts_.weightDecay, step_};
  for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
    const int64_t n = expAvg_[u].numel();
    if (n == 0) continue;
    kernels::adamwStep(fsdp_.masterShard(u).narrow(0, 0, n), fsdp_.gradShard(u).narrow(0, 0, n), expAvg_[u],
                       expAvgSq_[u], s);
  }
}

std::map<std::string, at::Tensor> ShardedAdamW::stateDict() const {
  std::map<std::string, at::Tensor> out;
  for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
    out[fsdp_.unitName(u) + ".exp_avg"] = expAvg_[u].clone();
    out[fsdp_.unitName(u) + ".exp_avg_sq"] = expAvgSq_[u].clone();
  }
  out["step"] = at::tensor(step_, at::kLong);
  return out;
}

void ShardedAdamW::loadStateDict(const std::map<std::string, at::Tensor>& sd) {
  torch::NoGradGuard ng;
  TESSERA_CHECK(sd.count("step"), "ShardedAdamW::loadStateDict: missing key 'step'");
  for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
    for (auto [suffix, dst] : {std::pair{".exp_avg", &expAvg_[u]}, std::pair{".exp_avg_sq", &expAvgSq_[u]}}) {
      const auto key = fsdp_.unitName(u) + suffix;
      auto it = sd.find(key);
      TESSERA_CHECK(it != sd.end(), "ShardedAdamW::loadStateDict: missing key '{}'", key);
      TESSERA_CHECK(it->second.numel() == dst->numel(),
                    "ShardedAdamW::loadStateDict: '{}' has {} elements, this rank's shard state has {}", key,
                    it->second.numel(), dst->numel());
      dst->copy_(it->second.reshape({-1}));
    }
  }
  step_ = sd.at("step").item<int64_t>();
}

}  // namespace tessera
