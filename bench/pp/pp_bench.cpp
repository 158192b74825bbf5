// tessera's side of the pipeline benchmark: the benchmarks' GPT-735M (common/bench_model.h:
// src/models' GPT, the trainer's) split into pp = world stages (train::partitionModel: balanced by
// compute, the embedding a lookup; embedding + first blocks on stage 0, last blocks + final
// LayerNorm + head on the last), run by the PipelineExecutor with a 1F1B table (or GPipe /
// interleaved), trained as the anchor trains it (bf16 autocast forward, fp32 parameters, fused
// AdamW lr 1e-4, random tokens; global batch B split into MB micro-batches; 3 warm-ups then the
// median of STEPS). The linears sum their weight gradients in fp32 inside the GEMM across
// micro-batches (ParallelLinearOptions::accumulateGradInGemm; FUSED_WGRAD=0: autograd's sums).
//   B=32 MB=16 torchrun --nproc_per_node=2 --no-python tessera_bench_pp [--gpipe | --interleaved]
//   B=32 MB=16 tessera_bench_pp --emulate P    (one process, one device: pp_emulate.h)
// Env (read at the top): B, MB, STEPS, D, L, V, T; PARTITION=params splits the blocks evenly over
// the stages (PyTorch's L/pp) instead; LAYERS="7,5" gives the blocks per stage; EXTRA_WARMUP=k:
// 1F1B with k extra warm-up forwards on every stage but the last (schedule.h); FUSED_WGRAD;
// with --emulate, EXTRA_WARMUPS ("0 1 2 3": the extra warm-ups predicted) and the transfer model
// TESSERA_FAKE_COMM_BUSBW_GBPS / _LATENCY_US (common/fake_world.h; TESSERA_FAKE_WORLD is refused:
// a stage without its peer measures nothing).
// PyTorch's run (torch_anchor.py pp) uses torch.distributed.pipelining.Schedule1F1B with
// L/pp blocks per stage.
// Rank 0 prints RESULT {json} (common/timing.h) with pp, micro_batches, schedule, partition,
// every rank's peak memory and peak in-flight micro-batches, first_loss and last_loss.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench_model.h"
#include "tessera/comm/bootstrap/init.h"
#include "tessera/common/autocast.h"
#include "common/env.h"
#include "tessera/common/error.h"
#include "fake_world.h"
#include "fused_adamw.h"
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/pipeline/executor.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/train/model_spec.h"
#include "pp_emulate.h"
#include "timing.h"

namespace bench = tessera::bench;
namespace models = tessera::models;
namespace pl = tessera::pipeline;

namespace {

// "7,5" → {7, 5}: blocks per stage.
std::vector<int> counts(const std::string& name, const std::string& v) {
  std::vector<int> out;
  if (v.empty()) return out;
  for (const auto& part : bench::splitList(v, ',')) {
    TESSERA_CHECK(!part.empty() && part.size() < 6 && part.find_first_not_of("0123456789") == std::string::npos,
                  "{}={}: want blocks per stage as comma-separated counts, e.g. 7,5", name, v);
    out.push_back(std::stoi(part));
  }
  return out;
}

// The blocks split as evenly as the stages allow (earlier stages take the remainder): PyTorch's L/pp.
std::vector<int> evenSplit(int layers, int stages) {
  std::vector<int> out(stages, layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++out[s];
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  pl::ScheduleKind kind = pl::ScheduleKind::OneFOneB;
  int emulate = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--emulate" && i + 1 < argc) {
      emulate = std::stoi(argv[++i]);
      continue;
    }
    TESSERA_CHECK(a == "--gpipe" || a == "--interleaved" || a == "--zb-h1",
                  "usage: {} [--gpipe | --interleaved | --zb-h1] [--emulate P] (got {})", argv[0], a);
    kind = a == "--gpipe"         ? pl::ScheduleKind::GPipe
           : a == "--interleaved" ? pl::ScheduleKind::Interleaved1F1B
                                  : pl::ScheduleKind::ZeroBubbleH1;
  }
  const auto cfg = bench::modelFromEnv();
  const int64_t batch = bench::envInt("B", 16);
  const int micro = static_cast<int>(bench::envInt("MB", 8));
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  const auto fake = bench::fakeWorldFromEnv();
  TESSERA_CHECK(fake.size == 0,
                "pp_bench: TESSERA_FAKE_WORLD is not for pipelines (a stage without its peer measures nothing); unset "
                "it (--emulate 2 predicts two stages on one device)");
  const int extraWarmup = static_cast<int>(bench::envInt("EXTRA_WARMUP", 0));
  const bool fused = bench::envInt("FUSED_WGRAD", 1) != 0;
  const std::string partition = tessera::env::get("PARTITION").value_or("compute");
  TESSERA_CHECK(partition == "compute" || partition == "params", "PARTITION={}: expected compute or params", partition);
  const std::vector<int> layers = counts("LAYERS", tessera::env::get("LAYERS").value_or(""));
  std::vector<int> extras;
  std::istringstream extrasIn(tessera::env::get("EXTRA_WARMUPS").value_or("0 1 2 3"));
  for (int e; extrasIn >> e;) extras.push_back(e);

  const int chunks = kind == pl::ScheduleKind::Interleaved1F1B ? 2 : 1;
  if (emulate) {
    TESSERA_CHECK(bench::envInt("WORLD_SIZE", 1) == 1, "pp_bench --emulate runs as one process");
    const auto device = bench::singleProcessDevice();
    bench::useDevice(device);
    bench::PipelineEmulation e{emulate, kind, extraWarmup, extras, fake.timing};
    return bench::emulatePipeline(cfg, device, batch, micro, steps, fused, e);
  }

  auto ctx = tessera::init();
  const auto& world = ctx.world;
  const int pp = world->size(), rank = world->rank();
  const auto device = ctx.device;
  bench::useDevice(device);
  const auto part = tessera::train::partitionModel(cfg, pp, chunks,
                                           !layers.empty()         ? layers
                                           : partition == "params" ? evenSplit(static_cast<int>(cfg.layers), pp * chunks)
                                                                   : std::vector<int>{});

  // This rank's stage(s) of the model; every layout draws the same weights (models/lm.h).
  const auto tp = bench::selfGroup(device);
  std::vector<models::LmChunk> stages;
  std::vector<pl::PipelineExecutor::ChunkFn> fns;
  std::vector<at::Tensor> params;
  for (int c = 0; c < chunks; ++c) {
    auto m = bench::buildModel(cfg, tp, tessera::train::chunkRange(part, part.stageOf(rank, c)));
    m->to(device);
    // FUSED_WGRAD=0: the weight gradients cast to fp32 and added into .grad by autograd at every
    // micro-batch; else (default) summed in fp32 by the GEMM.
    tessera::tp::setAccumulateGradInGemm(*m, fused);
    for (const auto& p : m->parameters()) params.push_back(p);
    fns.push_back([m, cuda = device.is_cuda()](const at::Tensor& x) mutable {
      tessera::Bf16Autocast autocast(cuda);
      return m->forward(x);
    });
    stages.push_back(m);
  }
  pl::ExecutorOptions eo;
  eo.device = device;
  const int64_t vocab = cfg.vocab;
  pl::PipelineExecutor exec(
      world, pl::makeSchedule(kind, pp, micro, chunks, extraWarmup), fns,
      [tp, vocab](const at::Tensor& logits, const at::Tensor& t) { return models::lmLoss(logits, t, tp, vocab); }, eo);
  bench::FusedAdamW opt(params);

  at::Tensor x, y;
  std::tie(x, y) = bench::randomBatch(cfg, batch, bench::kDataSeed, device);
  const bool first = rank == 0, last = rank == pp - 1;

  double firstLoss = 0, lastLoss = 0;
  bool firstStep = true;
  bench::resetPeakMemory(device);
  auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
    at::Tensor loss = exec.step(first ? x : at::Tensor(), last ? y : at::Tensor());
    opt.step();
    opt.zeroGrad(/*setToNone=*/true);
    lastLoss = loss.item<double>();
    if (firstStep) firstLoss = lastLoss, firstStep = false;
  }, rank);

  // Every rank's peak memory and in-flight count, gathered to rank 0 for the result line.
  auto mine = at::tensor({bench::peakMemoryGiB(device), static_cast<double>(exec.peakInFlight())},
                         at::TensorOptions().dtype(at::kDouble).device(device)).to(at::kFloat);
  auto all = at::empty({pp * 2}, mine.options());
  world->allGather(all, mine)->wait();
  auto allCpu = all.to(at::kCPU);
  std::vector<double> peaks, inflight;
  for (int r = 0; r < pp; ++r) {
    peaks.push_back(allCpu[2 * r].item<double>());
    inflight.push_back(allCpu[2 * r + 1].item<double>());
  }
  const std::string kindName = pl::toString(kind);
  std::string slug = kindName;
  std::replace(slug.begin(), slug.end(), ' ', '-');
  const std::string system =
      fmt::format("tessera-pp-{}-mb{}{}", slug, micro, extraWarmup ? fmt::format("-extra{}", extraWarmup) : "");
  bench::BenchResult r{system, "pp", pp, static_cast<double>(batch * cfg.seqLen), times,
                       *std::max_element(peaks.begin(), peaks.end()),
                       fmt::format("\"pp\": {}, \"batch\": {}, \"micro_batches\": {}, \"schedule\": \"{}\", "
                                   "\"extra_warmup\": {}, \"fused_wgrad\": {}, \"partition\": \"{}\", "
                                   "\"peak_mem_GiB_per_rank\": [{:.2f}], \"peak_in_flight_per_rank\": [{}], "
                                   "\"first_loss\": {}, \"last_loss\": {}",
                                   pp, batch, micro, kindName, extraWarmup, fused ? "true" : "false", part.describe(),
                                   fmt::join(peaks, ", "), fmt::join(inflight, ", "), bench::jsonNumber(firstLoss),
                                   bench::jsonNumber(lastLoss))};
  if (rank == 0) std::cout << bench::resultLine(cfg, r) << std::endl;
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "pp_bench: error: " << e.what() << std::endl;
  return 1;
}
