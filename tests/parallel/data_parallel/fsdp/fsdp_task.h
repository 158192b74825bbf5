#pragma once
// Shared by the FSDP tests: the tiny models split into FSDP units, their FSDP forward/loss,
// the single-process reference loss and one FSDP training step.
#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/args.h"
#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/nn/accum_embedding.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

namespace tessera::testing {
constexpr int kSteps = 5;
constexpr int64_t kBatch = 4;
constexpr double kLr = 1e-3;

struct Setup {
  std::string model = "gpt";
  int layers = 2;
  bool frozen = false;
  size_t autoBytes = 0;  // > 0: blocks auto-bucketed with this budget
};

// A model, its FSDP units and the FSDP forward/loss behind one interface.
struct Task {
  std::shared_ptr<torch::nn::Module> module;
  TinyGpt gpt{nullptr};
  TinyMlp mlp{nullptr};
  std::vector<FsdpUnitSpec> units;
  std::vector<std::vector<size_t>> blocksOf;  // gpt: unit -> block indices (unit 0 is the root)
  TinyGptOptions gopts;
  torch::Device dev = torch::kCPU;
  // gpt: the token lookup untracked, its rows to FSDP's sink (FsdpOptions::gatherEmbeddingRows).
  bool rows = false;
};

inline void freeze(torch::nn::Module& m) {
  for (auto& p : m.named_parameters(true)) {
    if (p.key() == "blocks.0.qkv.bias" || p.key() == "lnf.weight" || p.key() == "fc2.bias") p.value().requires_grad_(false);
  }
}

inline Task makeTask(const Setup& s, uint64_t seed, const torch::Device& dev = torch::kCPU) {
  Task t;
  t.dev = dev;
  if (s.model == "gpt") {
    t.gopts.layers = s.layers;
    t.gpt = makeTinyGpt(seed, t.gopts);
    t.module = t.gpt.ptr();
    t.gpt->to(dev);
    if (s.frozen) freeze(*t.module);
    FsdpUnitSpec root{"root", {}, false, {}};
    for (auto& p : t.gpt->named_parameters(true)) {
      if (p.key().rfind("blocks.", 0) != 0) root.params.emplace_back(p.key(), p.value());
    }
    t.units.push_back(root);
    t.blocksOf.push_back({});
    std::vector<NamedModule> mods;
    for (int64_t i = 0; i < s.layers; ++i) mods.emplace_back(fmt::format("blocks.{}", i), t.gpt->blocks[i]);
    for (auto& u : autoBucketUnits(mods, s.autoBytes)) {
      t.blocksOf.push_back(u.modules);
      t.units.push_back(std::move(u));
    }
  } else {
    t.mlp = makeTinyMlp(seed);
    t.module = t.mlp.ptr();
    t.mlp->to(dev);
    if (s.frozen) freeze(*t.module);
    for (const char* n : {"fc1", "fc2", "fc3"}) {
      FsdpUnitSpec u{n, {}, std::nullopt, {}};
      for (auto& p : t.mlp->named_children()) {
        if (p.key() != n) continue;
        for (auto& q : p.value()->named_parameters()) u.params.emplace_back(std::string(n) + "." + q.key(), q.value());
      }
      t.units.push_back(u);
    }
  }
  return t;
}

inline at::Tensor fsdpLoss(FullyShardedDataParallel& f, Task& t, int step, int micro, int rank) {
  if (!t.gpt.is_empty()) {
    auto b = gptBatch(1000 * step + micro, rank, kBatch, t.gopts, t.dev);
    auto m = t.gpt;
    auto x = f.runUnit(0, b.tokens, [&](const at::Tensor& tok) {
      auto e = t.rows ? nn::embeddingAccumulateGrad(tok, m->tok->weight, /*untracked=*/true) : m->tok->forward(tok);
      return e + m->pos.slice(0, 0, tok.size(1));
    });
    for (size_t u = 1; u < f.numUnits(); ++u) {
      x = f.runUnit(u, x, [&](const at::Tensor& h) {
        auto y = h;
        for (size_t blk : t.blocksOf[u]) y = m->blocks[blk]->as<GptBlock>()->forward(y);
        return y;
      });
    }
    auto logits = f.runUnit(0, x, [&](const at::Tensor& h) { return m->head->forward(m->lnf->forward(h)); });
    return gptLoss(logits, b.targets);
  }
  auto b = mlpBatch(1000 * step + micro, rank, kBatch, {}, t.dev);
  auto m = t.mlp;
  auto h = f.runUnit(0, b.x, [&](const at::Tensor& x) { return torch::relu(m->fc1->forward(x)); });
  h = f.runUnit(1, h, [&](const at::Tensor& x) { return torch::relu(m->fc2->forward(x)); });
  auto out = f.runUnit(2, h, [&](const at::Tensor& x) { return m->fc3->forward(x).to(at::kFloat); });
  return mlpLoss(out, b.y);
}

inline at::Tensor refLoss(Task& t, int step, int accum, int world) {
  if (!t.gpt.is_empty()) {
    std::vector<at::Tensor> tok, tgt;
    for (int k = 0; k < accum; ++k) {
      auto b = concatGptBatches(1000 * step + k, world, kBatch, t.gopts, t.dev);
      tok.push_back(b.tokens);
      tgt.push_back(b.targets);
    }
    return gptLoss(t.gpt->forward(at::cat(tok)), at::cat(tgt));
  }
  std::vector<at::Tensor> x, y;
  for (int k = 0; k < accum; ++k) {
    auto b = concatMlpBatches(1000 * step + k, world, kBatch, {}, t.dev);
    x.push_back(b.x);
    y.push_back(b.y);
  }
  return mlpLoss(t.mlp->forward(at::cat(x)), at::cat(y));
}

// One training step of FSDP (accum micro-batches, noSync on all but the last).
// pipelined: the forwards of all `accum` micro-steps run before their backwards (as a
// pipeline schedule does; each backward a call of its own, noSync for all but the last).
// keep: the micro-batches inside a KeepGathered scope, ended before the clip and the step.
inline double fsdpStep(FullyShardedDataParallel& f, ShardedAdamW& opt, Task& t, int step, int accum, int rank, double clip,
                       bool pipelined = false, bool keep = false) {
  opt.zeroGrad();
  std::optional<FullyShardedDataParallel::KeepGathered> kept;
  if (keep) kept.emplace(f);
  std::vector<at::Tensor> pending;
  // noSync backwards must not communicate gradients: no reduce-scatter (hybrid sharding's
  // replica all-reduce only follows a reduce-scatter); the synchronised one must.
  auto backward = [&](const at::Tensor& loss, bool last) {
    const int64_t before = f.stats().reduceScatters;
    if (last) {
      loss.backward();
      WCHECK(f.stats().reduceScatters > before, "step {}: the synchronised backward issued no reduce-scatter", step);
    } else {
      auto guard = f.noSync();
      loss.backward();
      WCHECK(f.stats().reduceScatters == before, "step {}: a noSync backward issued {} reduce-scatters", step,
             f.stats().reduceScatters - before);
    }
  };
  for (int k = 0; k < accum; ++k) {
    auto loss = fsdpLoss(f, t, step, k, rank) / accum;
    if (pipelined) {
      pending.push_back(loss);
    } else {
      backward(loss, k + 1 == accum);
    }
  }
  for (size_t k = 0; k < pending.size(); ++k) backward(pending[k], k + 1 == pending.size());
  if (keep) {
    WCHECK(f.stats().unshardedUnits == static_cast<int>(f.numUnits()), "step {}: {} of {} units gathered at the "
           "step's end inside KeepGathered", step, f.stats().unshardedUnits, f.numUnits());
    kept.reset();
    WCHECK(f.stats().unshardedUnits == 0, "step {}: {} units still gathered after KeepGathered ended", step,
           f.stats().unshardedUnits);
  }
  const double norm = clip > 0 ? f.clipGradNorm(clip).item<double>() : 0;
  opt.step();
  return norm;  // the gradient norm before clipping (0 when not clipping)
}

inline Setup setupFrom(std::map<std::string, std::string>& a) {
  Setup s;
  if (a.count("model")) s.model = a["model"];
  if (a.count("layers")) s.layers = std::stoi(a["layers"]);
  s.frozen = a.count("frozen") && a["frozen"] == "1";
  if (a.count("auto")) s.autoBytes = std::stoul(a["auto"]);
  return s;
}

}  // namespace tessera::testing
