// The one-device pipeline probe (contract in pp_emulate.h).
#include "pp_emulate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "bench_model.h"
#include "comm/fake/fake_timing.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "device_timer.h"
#include "fused_adamw.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/pipeline/partition.h"
#include "tessera/parallel/pipeline/simulate.h"
#include "tessera/parallel/data_parallel/data_parallel.h"
#include "timing.h"

namespace tessera::bench {

namespace pl = tessera::pipeline;

namespace {

// The model cut into the units a stage boundary can fall between.
struct PipelineUnits {
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  Fn embed;                                      // tokens -> hidden
  std::vector<Fn> blocks;                        // hidden -> hidden
  Fn head;                                       // hidden -> logits (final LayerNorm, head)
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;  // logits, targets -> loss
  std::vector<std::vector<at::Tensor>> params;  // per unit: embed, blocks..., head
  std::vector<int64_t> blockParams;
  int64_t embedParams = 0, headParams = 0;
};

// One stage holding the whole model: its parts are the embedding, each block, the final norm and
// the head (models/lm.h; no learned positions), its FSDP units the same parts' parameters.
PipelineUnits unitsOf(models::LmChunk& m, const CommPtr& tp) {
  const auto& c = m->cfg;
  const auto parts = m->parts();
  const auto specs = partUnits(parts, "stage0").units;
  const size_t L = static_cast<size_t>(c.layers);
  TESSERA_CHECK(c.positions != models::Positions::Learned && !c.tiedEmbeddings && parts.size() == L + 3 &&
                    specs.size() == L + 3,
                "pp emulation: the model's parts are not embedding, {} blocks, norm, head ({})", L, c.describe());
  auto tensors = [&](size_t k) {
    std::vector<at::Tensor> out;
    for (const auto& [name, t] : specs[k].params) out.push_back(t);
    return out;
  };
  auto count = [](const std::vector<at::Tensor>& ts) {
    int64_t n = 0;
    for (const auto& t : ts) n += t.numel();
    return n;
  };
  PipelineUnits u;
  u.embed = parts[0].run;
  u.params.push_back(tensors(0));
  u.embedParams = count(u.params.back());
  for (size_t b = 0; b < L; ++b) {
    u.blocks.push_back(parts[1 + b].run);
    u.params.push_back(tensors(1 + b));
    u.blockParams.push_back(count(u.params.back()));
  }
  u.head = [norm = parts[L + 1].run, head = parts[L + 2].run](const at::Tensor& x) { return head(norm(x)); };
  auto headParams = tensors(L + 1);
  for (auto& t : tensors(L + 2)) headParams.push_back(t);
  u.headParams = count(headParams);
  u.params.push_back(headParams);
  u.loss = [tp, vocab = c.vocab](const at::Tensor& logits, const at::Tensor& y) {
    return models::lmLoss(logits, y, tp, vocab);
  };
  return u;
}

struct UnitCosts {
  // ms per micro-batch (fwd; bwd: the input gradient and the weight gradients the linears cannot
  // defer; wgt: the deferred weight-gradient GEMMs, a zero-bubble schedule's W) and per step (opt),
  // by unit.
  std::vector<double> fwd, bwd, wgt, opt;
  std::vector<double> hostFwd, hostBwd;  // the host's time issuing them (ms per micro-batch)
  double hostStepMs = 0;                 // the host's time issuing a whole step (median)
};

// Times every unit over `steps` steps after the warm-ups; returns the means and the activation bytes.
UnitCosts measure(const models::ModelConfig& cfg, PipelineUnits& u, const at::Device& dev, int64_t batch, int M,
                  int steps, int64_t& actBytes, double& sequentialMs) {
  const int n = static_cast<int>(u.blocks.size()) + 2;
  std::vector<FusedAdamW> opts;
  for (auto& p : u.params) opts.emplace_back(p);
  const auto xy = randomBatch(cfg, batch, kDataSeed, dev);
  auto xs = xy.first.chunk(M, 0), ys = xy.second.chunk(M, 0);
  UnitCosts c{std::vector<double>(n, 0), std::vector<double>(n, 0), std::vector<double>(n, 0),
              std::vector<double>(n, 0), std::vector<double>(n, 0), std::vector<double>(n, 0)};
  DeviceTimer timer(dev);
  std::vector<double> seq, hostSeq;
  for (int step = 0; step < kWarmSteps + steps; ++step) {
    timer.clear();
    // marks[u]: (begin, end) pairs of unit u's forward, backward, optimizer.
    std::vector<std::vector<std::pair<int, int>>> fm(n), bm(n), wm(n), om(n);
    const int first = timer.mark();
    {
      tessera::Bf16Autocast autocast(dev.is_cuda());
      for (int m = 0; m < M; ++m) {
        std::vector<at::Tensor> ins(n), outs(n);
        at::Tensor h;
        for (int k = 0; k < n; ++k) {
          const int a = timer.mark();
          if (k == 0) {
            h = u.embed(xs[m]);
          } else {
            ins[k] = h.detach().requires_grad_(true);
            h = k == n - 1 ? u.loss(u.head(ins[k]), ys[m]) / static_cast<double>(M) : u.blocks[k - 1](ins[k]);
          }
          if (k == 1) actBytes = static_cast<int64_t>(h.numel()) * h.element_size();
          outs[k] = h;
          fm[k].push_back({a, timer.mark()});
        }
        at::Tensor g;
        for (int k = n - 1; k >= 0; --k) {
          const int a = timer.mark();
          nn::WeightGradQueue w;  // B, then W: the weight-gradient GEMMs the linears defer
          {
            nn::DeferWeightGrads defer(w);
            if (k == n - 1) {
              torch::autograd::backward({outs[k]});
            } else {
              torch::autograd::backward({outs[k]}, {g});
            }
          }
          const int b = timer.mark();
          w.run();
          if (k > 0) g = ins[k].grad();
          bm[k].push_back({a, b});
          wm[k].push_back({b, timer.mark()});
        }
      }
    }
    for (int k = 0; k < n; ++k) {
      const int a = timer.mark();
      opts[k].step();
      om[k].push_back({a, timer.mark()});
      opts[k].zeroGrad(/*setToNone=*/true);
    }
    const int last = timer.mark();
    synchronize(dev);
    if (step < kWarmSteps) continue;
    seq.push_back(timer.ms(first, last));
    hostSeq.push_back(timer.hostMs(first, last));
    for (int k = 0; k < n; ++k) {
      for (auto [a, b] : fm[k]) c.fwd[k] += timer.ms(a, b) / (M * steps), c.hostFwd[k] += timer.hostMs(a, b) / (M * steps);
      for (auto [a, b] : bm[k]) c.bwd[k] += timer.ms(a, b) / (M * steps), c.hostBwd[k] += timer.hostMs(a, b) / (M * steps);
      for (auto [a, b] : wm[k]) c.wgt[k] += timer.ms(a, b) / (M * steps);
      for (auto [a, b] : om[k]) c.opt[k] += timer.ms(a, b) / steps;
    }
  }
  sequentialMs = median(seq);
  c.hostStepMs = median(hostSeq);
  return c;
}

struct Prediction {
  std::string partition;
  std::vector<int> layers;
  int extra = 0;
  double stepMs = 0, pipeMs = 0, optMs = 0;
  std::vector<double> stageMs, idleMs;
};

}  // namespace

int emulatePipeline(const models::ModelConfig& cfg, const at::Device& dev, int64_t batch, int M, int steps,
                    bool fusedWgrad, const PipelineEmulation& e) {
  const int pp = e.pp, extraWarmup = e.extraWarmup;
  const pl::ScheduleKind kind = e.kind;
  TESSERA_CHECK(pp >= 2, "pp_bench --emulate {}: emulate at least 2 stages", pp);
  const int chunks = kind == pl::ScheduleKind::Interleaved1F1B ? 2 : 1;
  const int L = static_cast<int>(cfg.layers);
  // The schedule's own checks (e.g. EXTRA_WARMUP with an interleaved schedule) before measuring.
  pl::makeSchedule(kind, pp, M, chunks, extraWarmup);
  const auto self = selfGroup(dev);
  auto model = buildModel(cfg, self, tessera::models::ChunkRange::whole(cfg));
  model->to(dev);
  tp::setAccumulateGradInGemm(*model, fusedWgrad);
  auto u = unitsOf(model, self);
  int64_t actBytes = 0;
  double sequentialMs = 0;
  const auto c = measure(cfg, u, dev, batch, M, steps, actBytes, sequentialMs);
  const double transferMs = fakeOpSeconds(e.transfer, "send", static_cast<double>(actBytes), 2) * 1e3;

  // Candidate partitions: the two balanced ones, and for pp = 2 every split.
  std::vector<std::pair<std::string, pl::Partition>> parts;
  pl::PartitionOptions po;
  po.pp = pp;
  po.chunks = chunks;
  po.embeddingParams = u.embedParams;
  po.headParams = u.headParams;
  po.embeddingIsLookup = true;
  parts.push_back({"compute", pl::partitionBlocks(u.blockParams, po)});
  po.embeddingIsLookup = false;
  parts.push_back({"params", pl::partitionBlocks(u.blockParams, po)});
  if (pp == 2 && chunks == 1)
    for (int k = 1; k < L; ++k) {
      po.layersPerStage = {k, L - k};
      auto split = pl::partitionBlocks(u.blockParams, po);
      // A split that is one of the balanced ones already is simulated once, under that name.
      if (std::none_of(parts.begin(), parts.end(), [&](const auto& p) { return p.second.bounds == split.bounds; }))
        parts.push_back({fmt::format("split{}+{}", k, L - k), split});
    }
  std::vector<int> extras;
  if (kind == pl::ScheduleKind::OneFOneB) {
    extras = e.extraWarmups;
    if (std::find(extras.begin(), extras.end(), extraWarmup) == extras.end()) extras.push_back(extraWarmup);
  } else {
    extras = {0};
  }

  std::vector<Prediction> preds;
  for (const auto& [name, part] : parts) {
    const int S = part.numStages();
    std::vector<pl::StageCost> costs(S);
    std::vector<double> optByRank(pp, 0);
    for (int s = 0; s < S; ++s) {
      std::vector<int> units;  // indices into c (0 embed, 1 + block, L + 1 head)
      if (s == 0) units.push_back(0);
      for (int b = part.firstBlock(s); b < part.endBlock(s); ++b) units.push_back(1 + b);
      if (s == S - 1) units.push_back(L + 1);
      for (int k : units) {
        costs[s].forward += c.fwd[k];
        costs[s].backward += c.bwd[k];
        costs[s].weight += c.wgt[k];
        optByRank[s % pp] += c.opt[k];
      }
    }
    std::vector<int> layers;
    for (int s = 0; s < S; ++s) layers.push_back(part.endBlock(s) - part.firstBlock(s));
    for (int x : extras) {
      auto sim = pl::simulateStep(pl::makeSchedule(kind, pp, M, chunks, x), costs, transferMs);
      Prediction p{name, layers, x, 0, sim.step, *std::max_element(optByRank.begin(), optByRank.end()), {}, sim.idle};
      p.stepMs = p.pipeMs + p.optMs;
      for (const auto& sc : costs) p.stageMs.push_back(M * (sc.forward + sc.backward + sc.weight));
      preds.push_back(p);
    }
  }

  double unitF = 0, unitB = 0, unitW = 0, unitO = 0, hostF = 0, hostB = 0;
  for (size_t k = 0; k < c.fwd.size(); ++k) {
    unitF += c.fwd[k], unitB += c.bwd[k], unitW += c.wgt[k], unitO += c.opt[k];
    if (k > 0 && k < c.fwd.size() - 1) hostF += c.hostFwd[k] / L, hostB += c.hostBwd[k] / L;
  }
  std::cout << fmt::format(
                   "pp emulation on one {}: {} micro-batches of {}; per micro-batch embed F {:.3f} B {:.3f} ms, block "
                   "F {:.3f} B {:.3f} W {:.3f} ms (mean), head+loss F {:.3f} B {:.3f} ms; optimizer {:.2f} ms a step; "
                   "transfer {:.3f} ms ({} bytes); sequential step {:.2f} ms (units summed: {:.2f}); the host issued "
                   "a block's F in {:.3f} ms and B in {:.3f} ms (mean), the step in {:.2f} ms",
                   dev.str(), M, batch / M, c.fwd[0], c.bwd[0], (unitF - c.fwd[0] - c.fwd[L + 1]) / L,
                   (unitB - c.bwd[0] - c.bwd[L + 1]) / L, (unitW - c.wgt[0] - c.wgt[L + 1]) / L, c.fwd[L + 1],
                   c.bwd[L + 1], unitO, transferMs, actBytes, sequentialMs, M * (unitF + unitB + unitW) + unitO, hostF,
                   hostB, c.hostStepMs)
            << std::endl;
  std::cout << "| partition | layers per stage | extra warm-up | predicted step ms | pipeline ms | optimizer ms | "
               "stage compute ms | idle ms per rank |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : preds)
    std::cout << fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.1f} | {:.1f} |\n", p.partition,
                             fmt::join(p.layers, "+"), p.extra, p.stepMs, p.pipeMs, p.optMs, fmt::join(p.stageMs, ", "),
                             fmt::join(p.idleMs, ", "));
  std::cout.flush();

  const std::string kindName = pl::toString(kind);
  std::string slug = kindName;
  std::replace(slug.begin(), slug.end(), ' ', '-');
  auto row = [&](const Prediction& p, const std::string& system) {
    BenchResult r{system, "pp", pp, static_cast<double>(batch * cfg.seqLen), {p.stepMs / 1e3}, 0,
                  fmt::format("\"pp\": {}, \"batch\": {}, \"micro_batches\": {}, \"schedule\": \"{}\", \"extra_warmup\": {}, "
                              "\"partition\": \"{}\", \"layers_per_stage\": [{}], \"emulated\": \"one {}: unit costs "
                              "measured, the {}-stage schedule simulated (src/parallel/pipeline/simulate.h)\", "
                              "\"pipeline_ms\": {:.2f}, \"optimizer_ms\": {:.2f}, \"idle_ms_per_rank\": [{:.2f}], "
                              "\"sequential_step_ms\": {:.2f}, \"transfer_ms\": {:.3f}",
                              pp, batch, M, kindName, p.extra, p.partition, fmt::join(p.layers, ", "), dev.str(), pp,
                              p.pipeMs, p.optMs, fmt::join(p.idleMs, ", "), sequentialMs, transferMs)};
    std::cout << resultLine(cfg, r) << std::endl;
  };
  auto find = [&](const std::string& part, int e) {
    return *std::find_if(preds.begin(), preds.end(), [&](const Prediction& p) { return p.partition == part && p.extra == e; });
  };
  const std::string base = fmt::format("tessera-pp-{}-mb{}", slug, M);
  row(find("compute", 0), base + "-emulated");
  if (extraWarmup != 0) row(find("compute", extraWarmup), fmt::format("{}-extra{}-emulated", base, extraWarmup));
  const auto best = *std::min_element(preds.begin(), preds.end(),
                                      [](const Prediction& a, const Prediction& b) { return a.stepMs < b.stepMs; });
  row(best, fmt::format("{}-best-{}-extra{}-emulated", base, best.partition, best.extra));
  return 0;
}

}  // namespace tessera::bench
