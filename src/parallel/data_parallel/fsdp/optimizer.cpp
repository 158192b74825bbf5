#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "tessera/common/error.h"
#include "kernels/multi_tensor_adamw.h"
#include "optim/adamw_step.h"

namespace tessera {

ShardedAdamW::ShardedAdamW(FullyShardedDataParallel& fsdp, AdamWOptions o, DecayRule decays)
    : fsdp_(fsdp), opts_(o) {
  const int r = fsdp_.shardRank();
  for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
    const auto& lay = fsdp_.layout(u);
    const int64_t n = lay.trainableInShard(r);
    expAvg_.push_back(at::zeros({n}, fsdp_.masterShard(u).options()));
    expAvgSq_.push_back(at::zeros({n}, fsdp_.masterShard(u).options()));
    // Runs of equal decay over the shard's trainable prefix (padding after the last entry is
    // stepped with its neighbour: it stays zero, its gradient is zero).
    std::vector<Run> runs;
    const int64_t lo = r * lay.shardNumel;
    for (const auto& e : lay.entries) {
      const int64_t a = std::max<int64_t>(0, e.offset - lo), b = std::min(n, e.offset + e.numel - lo);
      if (!e.trainable || a >= b) continue;
      const bool d = !decays || decays(e.name);
      if (!runs.empty() && runs.back().decay == d) {
        runs.back().end = b;
      } else {
        runs.push_back({runs.empty() ? 0 : runs.back().end, b, d});
      }
    }
    if (!runs.empty()) runs.back().end = n;
    runs_.push_back(std::move(runs));
  }
}

void ShardedAdamW::step(const at::Tensor& gradScale) {
  TESSERA_CHECK(!fsdp_.keepingGathered(),
                "ShardedAdamW::step: called inside FSDP's KeepGathered scope: the gathered units would keep the old "
                "values; end the scope (it reshards them) before the step");
  torch::NoGradGuard ng;
  ++step_;
  // With gatherAfterStep, the units the next forward starts with go first, and their all-gathers
  // run beside the update of the rest.
  std::vector<int> lead;
  if (fsdp_.options().gatherAfterStep) lead = fsdp_.leadingUnits();
  std::vector<bool> leads(fsdp_.numUnits(), false);
  for (int u : lead) leads[u] = true;
  auto update = [&](bool leading) {
    std::vector<at::Tensor> p, g, m, v;
    std::vector<bool> decay;
    for (size_t u = 0; u < fsdp_.numUnits(); ++u) {
      if (leads[u] != leading) continue;
      for (const auto& run : runs_[u]) {
        const int64_t a = run.begin, n = run.end - run.begin;
        p.push_back(fsdp_.masterShard(u).narrow(0, a, n));
        g.push_back(fsdp_.gradShard(u).narrow(0, a, n));
        m.push_back(expAvg_[u].narrow(0, a, n));
        v.push_back(expAvgSq_[u].narrow(0, a, n));
        decay.push_back(run.decay);
      }
    }
    if (!p.empty()) kernels::multiTensorAdamW(p, g, m, v, decay, adamwKernelStep(opts_, step_), {}, gradScale);
  };
  if (!lead.empty()) {
    update(true);
    fsdp_.gatherForNextForward(lead);
  }
  update(false);
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
