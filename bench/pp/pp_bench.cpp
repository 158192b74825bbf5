// tessera's side of the pipeline benchmark: the anchors' GPT-735M (common/gpt.h) split into
// pp = world stages by tessera::pipeline (balanced partition: embedding + first blocks on stage
// 0, last blocks + final LayerNorm + head on the last), run by the PipelineExecutor with a 1F1B
// table (or GPipe / interleaved), trained as the anchor trains it (bf16 autocast forward, fp32
// parameters, fused AdamW lr 1e-4, random tokens; global batch B split into MB micro-batches;
// 3 warm-ups then the median of STEPS). The blocks' and head's linears sum their weight gradients
// in fp32 inside the GEMM across micro-batches (nn::linearAccumulateGrad; FUSED_WGRAD=0: at::linear).
//   B=32 MB=16 torchrun --nproc_per_node=2 --no-python tessera_bench_pp [--gpipe | --interleaved]
// The embedding sums its gradient into .grad row by row (nn::embeddingAccumulateGrad) when the
// linears do. The partition balances compute (PartitionOptions::embeddingIsLookup); PARTITION=params
// balances parameter counts instead (for the anchor's 12 blocks the same 6 + 6 split as PyTorch's
// run); LAYERS="7,5" gives the blocks per stage. EXTRA_WARMUP=k: 1F1B with k extra warm-up forwards
// on every stage but the last (schedule.h). PP_EMULATE=P (one process, one device): the P-stage
// pipeline predicted from measured unit costs (pp_emulate.h).
// PyTorch's run (torch_anchor.py pp) uses torch.distributed.pipelining.Schedule1F1B with
// L/pp blocks per stage.
// Rank 0 prints RESULT {json} (common/timing.h) with pp, micro_batches, schedule, partition and
// every rank's peak memory and peak in-flight micro-batches.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "comm/bootstrap/init.h"
#include "common/error.h"
#include "gpt.h"
#include "pipeline/executor.h"
#include "pipeline/partition.h"
#include "nn/accum_embedding.h"
#include "pipeline/schedule.h"
#include "fake_world.h"
#include "pp_emulate.h"
#include "timing.h"

namespace bench = tessera::bench;
namespace pl = tessera::pipeline;

namespace {

// The last stage's tail: final LayerNorm then the untied head (BenchGpt's lnf + head).
struct GptHeadImpl : torch::nn::Module {
  explicit GptHeadImpl(const bench::GptConfig& c) {
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d, c.vocab).bias(false)));
  }
  at::Tensor forward(const at::Tensor& x) { return bench::linear(head, lnf->forward(x), accumulateGrad); }
  torch::nn::LayerNorm lnf{nullptr};
  torch::nn::Linear head{nullptr};
  bool accumulateGrad = false;
};
TORCH_MODULE(GptHead);

// The token embedding (BenchGpt's emb), its gradient summed into .grad when accumulateGrad.
struct GptEmbedImpl : torch::nn::Module {
  explicit GptEmbedImpl(const bench::GptConfig& c) {
    emb = register_module("emb", torch::nn::Embedding(c.vocab, c.d));
  }
  at::Tensor forward(const at::Tensor& ids) {
    return accumulateGrad ? tessera::nn::embeddingAccumulateGrad(ids, emb->weight) : emb->forward(ids);
  }
  torch::nn::Embedding emb{nullptr};
  bool accumulateGrad = false;
};
TORCH_MODULE(GptEmbed);

std::vector<int> layersFromEnv() {
  std::vector<int> out;
  const char* v = std::getenv("LAYERS");
  if (!v || !*v) return out;
  for (const auto& part : bench::splitList(v, ',')) {
    TESSERA_CHECK(!part.empty() && part.find_first_not_of("0123456789") == std::string::npos,
                  "LAYERS={}: want blocks per stage as comma-separated counts, e.g. 7,5", v);
    out.push_back(std::stoi(part));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  pl::ScheduleKind kind = pl::ScheduleKind::OneFOneB;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    TESSERA_CHECK(a == "--gpipe" || a == "--interleaved", "usage: {} [--gpipe | --interleaved] (got {})", argv[0], a);
    kind = a == "--gpipe" ? pl::ScheduleKind::GPipe : pl::ScheduleKind::Interleaved1F1B;
  }
  const bench::GptConfig cfg = bench::gptConfigFromEnv();
  const int64_t batch = bench::envInt("B", 16);
  const int micro = static_cast<int>(bench::envInt("MB", 8));
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  TESSERA_CHECK(bench::fakeWorldSize() == 0,
                "pp_bench: FAKE_WORLD is not for pipelines (a stage without its peer measures nothing); unset it "
                "(PP_EMULATE=2 predicts two stages on one device)");
  const int extraWarmup = static_cast<int>(bench::envInt("EXTRA_WARMUP", 0));
  const int emulate = static_cast<int>(bench::envInt("PP_EMULATE", 0));
  tessera::Context ctx;
  if (!emulate) ctx = tessera::init();
  const int pp = emulate ? emulate : ctx.world->size(), rank = emulate ? 0 : ctx.world->rank();
  const int chunks = kind == pl::ScheduleKind::Interleaved1F1B ? 2 : 1;
  const auto device = emulate ? bench::singleProcessDevice() : ctx.device;
  bench::useDevice(device);

  // The whole model on the CPU (every rank alike), then this rank's stage modules to the device.
  torch::manual_seed(0);
  pl::SequentialModel model;
  GptEmbed emb(cfg);
  model.embedding = torch::nn::AnyModule(emb);
  std::vector<bench::BenchBlock> blocks;
  // FUSED_WGRAD=0: at::linear, the weight gradients cast to fp32 and added into .grad by autograd
  // at every micro-batch; else (default) summed in fp32 by the GEMM (nn::linearAccumulateGrad).
  const bool fused = bench::envInt("FUSED_WGRAD", 1) != 0;
  for (int64_t i = 0; i < cfg.layers; ++i) {
    blocks.emplace_back(cfg.d, cfg.heads);
    blocks.back()->accumulateGrad = fused;
    model.blocks.emplace_back(blocks.back());
  }
  GptHead head(cfg);
  head->accumulateGrad = fused;
  emb->accumulateGrad = fused;
  model.head = torch::nn::AnyModule(head);
  if (emulate) {
    bench::PipelineUnits u;
    emb->to(device);
    head->to(device);
    u.embed = [emb](const at::Tensor& t) mutable { return emb->forward(t); };
    u.head = [head](const at::Tensor& t) mutable { return head->forward(t); };
    u.params.push_back(emb->parameters());
    for (auto& b : blocks) {
      b->to(device);
      u.blocks.push_back([b](const at::Tensor& t) mutable { return b->forward(t); });
      u.params.push_back(b->parameters());
      int64_t n = 0;
      for (const auto& p : b->parameters()) n += p.numel();
      u.blockParams.push_back(n);
    }
    u.params.push_back(head->parameters());
    for (const auto& p : emb->parameters()) u.embedParams += p.numel();
    for (const auto& p : head->parameters()) u.headParams += p.numel();
    return bench::emulatePipeline(cfg, u, device, batch, micro, steps, pp, kind, extraWarmup);
  }
  const auto& world = ctx.world;
  pl::PartitionOptions po;
  po.pp = pp;
  po.chunks = chunks;
  // By compute (the default here; PARTITION=params for PyTorch's L/pp split by storage): the
  // embedding lookup costs nothing and the head's GEMM (plus the loss) runs on the last stage.
  po.embeddingIsLookup = std::string(std::getenv("PARTITION") ? std::getenv("PARTITION") : "compute") != "params";
  po.layersPerStage = layersFromEnv();
  auto part = pl::partitionModel(model, po);
  std::vector<pl::PipelineExecutor::ChunkFn> fns;
  std::vector<at::Tensor> params;
  for (int c = 0; c < chunks; ++c) {
    const int s = part.stageOf(rank, c);
    if (s == 0) emb->to(device);
    for (int b = part.firstBlock(s); b < part.endBlock(s); ++b) blocks[b]->to(device);
    if (s == part.numStages() - 1) head->to(device);
    auto st = pl::buildStage(model, part, s);
    fns.push_back(st.forward);
    params.insert(params.end(), st.parameters.begin(), st.parameters.end());
  }
  pl::ExecutorOptions eo;
  eo.device = device;
  pl::PipelineExecutor exec(world, pl::makeSchedule(kind, pp, micro, chunks, extraWarmup), fns, bench::gptLoss, eo);
  bench::FusedAdamW opt(params);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto x = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);
  auto y = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);
  const bool first = rank == 0, last = rank == pp - 1;

  double lastLoss = 0;
  bench::resetPeakMemory(device);
  auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
    at::Tensor loss;
    {
      bench::Bf16Autocast autocast(device.is_cuda());
      loss = exec.step(first ? x : at::Tensor(), last ? y : at::Tensor());
    }
    opt.step();
    opt.zeroGrad(/*setToNone=*/true);
    lastLoss = loss.item<double>();
  });

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
                                   "\"peak_mem_GiB_per_rank\": [{:.2f}], \"peak_in_flight_per_rank\": [{}], \"last_loss\": {}",
                                   pp, batch, micro, kindName, extraWarmup, fused ? "true" : "false", part.describe(),
                                   fmt::join(peaks, ", "), fmt::join(inflight, ", "), bench::jsonNumber(lastLoss))};
  if (rank == 0) std::cout << bench::resultLine(cfg, r) << std::endl;
  world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "pp_bench: error: " << e.what() << std::endl;
  return 1;
}
