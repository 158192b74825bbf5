// The trainer's MoE duties after each step (trainer_state.h): the selection biases moved by the
// step's loads, and the routing figures of the step's report. Both read the loads every sparse
// layer counted since the last step (models/moe.h) over the ranks that route other tokens with
// the same experts: the data group (dp × cp) and, with sequence parallel, the tp group.
#include <ATen/ATen.h>

#include "tessera/models/llama.h"
#include "train/trainer_state.h"

namespace tessera::train {

namespace {

std::vector<models::MoeImpl*> moeLayers(Parallel& par) {
  std::vector<models::MoeImpl*> out;
  for (auto& chunk : par.chunks) {
    for (auto& b : chunk->blocks) {
      if (auto* l = dynamic_cast<models::LlamaBlockImpl*>(b.get()); l && l->moe) out.push_back(l->moe.get());
    }
  }
  return out;
}

std::vector<CommPtr> routingGroups(const Config& o, const ProcessMesh& mesh) {
  std::vector<CommPtr> groups{mesh.dataGroup()};
  if (o.parallel.sequenceParallel) groups.push_back(mesh.tpGroup());
  return groups;
}

}  // namespace

void Trainer::State::afterUpdateMoe(Pending& p) {
  if (o.model.cfg.moe.experts == 0) return;
  // The loads summed over the routing groups once, for the report and the balancing (which resets them).
  const auto load = queueMoeStats(p);
  const auto layers = moeLayers(par);
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->updateBiasFrom(load[static_cast<int64_t>(i)]);
}

// Per layer [E + 3]: the loads summed over the routing groups, then over the world (pipeline
// stages' layers, replicas over tp) the worst ratios by max and {aux, z, dropped, assignments,
// layers} by sum: two small collectives on the device, read back with the step's values.
at::Tensor Trainer::State::queueMoeStats(Pending& p) {
  const auto& m = o.model.cfg.moe;
  const auto layers = moeLayers(par);
  const auto opt = at::TensorOptions().dtype(at::kFloat).device(device);
  auto worst = at::full({2}, -1e30, opt);  // max over layers of max/mean and of -(min/mean)
  auto sums = at::zeros({5}, opt);
  at::Tensor load;
  if (!layers.empty()) {
    std::vector<at::Tensor> rows;
    for (auto* l : layers) rows.push_back(l->statsOnDevice().to(device));
    auto s = at::stack(rows);  // [layers, E + 3]
    load = s.narrow(1, 0, m.experts).contiguous();
    for (const auto& g : routingGroups(o, *par.mesh)) {
      if (g && g->size() > 1) g->allReduce(load, ReduceOp::Sum)->wait();
    }
    auto mean = load.mean(1).clamp_min(1e-9);
    worst = at::stack({(std::get<0>(load.max(1)) / mean).max(), -(std::get<0>(load.min(1)) / mean).min()});
    auto kept = s.narrow(1, 0, m.experts).sum();  // this rank's own (s is untouched by the reduction of `load`)
    sums = at::stack({s.select(1, m.experts).sum(), s.select(1, m.experts + 1).sum(), s.select(1, m.experts + 2).sum(),
                      kept, at::full({}, static_cast<double>(layers.size()), opt)});
  }
  ctx.world->allReduce(worst, ReduceOp::Max)->wait();
  ctx.world->allReduce(sums, ReduceOp::Sum)->wait();
  p.moe.queue(at::cat({worst, sums}));
  return load;
}

void Trainer::State::readMoeStats(Pending& p, StepReport& rep) {
  if (!p.moe.queued()) return;
  const auto h = p.moe.get();
  const float* v = h.data_ptr<float>();
  const double layers = std::max(1.0f, v[6]);
  rep.moeLoadMax = v[0];
  rep.moeLoadMin = -v[1];
  // Each rank's own kept and dropped assignments summed over the world (tp replicas count both alike).
  const double dropped = v[4], kept = v[5];
  rep.moeDropped = dropped + kept > 0 ? dropped / (dropped + kept) : 0;
  rep.moeAuxLoss = v[2] / layers;
  rep.moeZLoss = v[3] / layers;
}

}  // namespace tessera::train
