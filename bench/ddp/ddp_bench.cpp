// tessera's side of the DDP benchmark: the GPT-735M of gpt.h trained as
// ../shared/anchors/torch_anchor.py trains it (bf16 autocast forward, fp32 parameters, fused
// AdamW lr 1e-4, random tokens, batch B per GPU, WARM=3 warm-ups then the median of STEPS=10
// steps, each step between two device synchronisations).
//   single : one process, no DDP          (torchrun --nproc_per_node=1 --no-python BIN single)
//   tessera: tessera::DistributedDataParallel over tessera::init()'s world, default options
//            (torchrun --nproc_per_node=2 --no-python BIN tessera [--bucket-view])
// --bucket-view sets DdpOptions::gradientAsBucketView (gradients then zeroed in place; without
// it gradients are set to None after each step, as the anchor's zero_grad(set_to_none=True)).
// Env as the anchor: B, STEPS, D, L, V, T (a smaller model for a smoke test).
// In tessera mode it then times the all-reduce of the gradients alone: every bucket of
// ddp.bucketLayout() (fp32, the same sizes) launched back to back, then waited, no backward;
// median of 10 after 3 warm-ups ("allreduce_ms"); the combiner turns it into the
// hidden-communication estimate.
// Rank 0 prints one line: RESULT {json} with the anchor's keys (mode, world, params_M,
// step_ms, tokens_per_s, mfu_vs_989, peak_mem_GiB) plus system, allreduce_ms, buckets.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/bootstrap/init.h"
#include "common/error.h"
#include "gpt.h"
#include "parallel/ddp/ddp.h"

namespace {

using tessera::bench::BenchGpt;
using tessera::bench::FusedAdamW;
using tessera::bench::GptConfig;

int64_t envInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : dflt;
}

// Median as the anchor takes it: sorted(times)[n // 2].
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs fn warm + steps times between device synchronisations; the timed steps' seconds.
std::vector<double> timeSteps(int warm, int steps, int dev, const std::function<void()>& fn) {
  std::vector<double> times;
  for (int i = 0; i < warm + steps; ++i) {
    torch::cuda::synchronize(dev);
    auto t0 = std::chrono::steady_clock::now();
    fn();
    torch::cuda::synchronize(dev);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warm) times.push_back(s);
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string mode = argc > 1 ? argv[1] : "";
  bool bucketView = false, commBf16 = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    TESSERA_CHECK(a == "--bucket-view" || a == "--comm-bf16", "ddp_bench: unknown argument {}", a);
    (a == "--bucket-view" ? bucketView : commBf16) = true;
  }
  TESSERA_CHECK(mode == "single" || mode == "tessera", "usage: {} single|tessera [--bucket-view] [--comm-bf16]",
                argv[0]);
  GptConfig cfg;
  cfg.d = envInt("D", 2048);
  cfg.layers = envInt("L", 12);
  cfg.heads = cfg.d / 128;
  cfg.vocab = envInt("V", 32000);
  cfg.seqLen = envInt("T", 1024);
  const int64_t batch = envInt("B", 8);
  const int steps = static_cast<int>(envInt("STEPS", 10)), warm = 3;

  tessera::Context ctx;
  int rank = 0, world = 1, dev = static_cast<int>(envInt("LOCAL_RANK", 0));
  if (mode == "tessera") {
    ctx = tessera::init();
    rank = ctx.world->rank();
    world = ctx.world->size();
    TESSERA_CHECK(ctx.device.is_cuda(), "ddp_bench: tessera::init() gave device {}, not CUDA", ctx.device.str());
    dev = ctx.device.index();
  } else {
    TESSERA_CHECK(envInt("WORLD_SIZE", 1) == 1, "ddp_bench: single mode runs one process");
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(dev));
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));

  torch::manual_seed(0);
  BenchGpt model(cfg);
  model->to(device);
  std::unique_ptr<tessera::DistributedDataParallel> ddp;
  if (mode == "tessera") {
    tessera::DdpOptions o;
    o.gradientAsBucketView = bucketView;
    if (commBf16) o.commDtype = at::kBFloat16;
    tessera::DistributedDataParallel::Named params, buffers;
    for (auto& p : model->named_parameters(true)) params.emplace_back(p.key(), p.value());
    for (auto& b : model->named_buffers(true)) buffers.emplace_back(b.key(), b.value());
    ddp = std::make_unique<tessera::DistributedDataParallel>(params, buffers, ctx.world, o);
  }
  FusedAdamW opt(model->parameters());
  const bool setToNone = !bucketView;

  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + rank);
  auto x = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);
  auto y = at::randint(0, cfg.vocab, {batch, cfg.seqLen}, gen, at::kLong).to(device);

  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(dev));
  auto times = timeSteps(warm, steps, dev, [&] {
    torch::Tensor loss;
    {
      tessera::bench::Bf16Autocast autocast;
      loss = tessera::bench::gptLoss(model->forward(x), y);
    }
    loss.backward();
    opt.step();
    if (ddp && !setToNone) ddp->zeroGrad();
    else opt.zeroGrad(setToNone);
  });
  const double med = median(times);
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(dev));
  const double peakGiB = static_cast<double>(stats.allocated_bytes[0].peak) / (1ull << 30);  // [0]: aggregate

  // The gradients' all-reduce alone, bucket by bucket as the reducer lays them out.
  double allreduceMs = 0;
  size_t nBuckets = 0;
  std::string bucketMib;
  if (ddp) {
    std::map<std::string, int64_t> numel;
    for (auto& p : model->named_parameters(true)) numel[p.key()] = p.value().numel();
    std::vector<at::Tensor> bufs;
    for (const auto& names : ddp->bucketLayout()) {
      int64_t n = 0;
      for (const auto& nm : names) n += numel.at(nm);
      bufs.push_back(at::zeros({n}, at::TensorOptions().device(device).dtype(at::kFloat)));
      bucketMib += fmt::format("{}{:.1f}", bucketMib.empty() ? "" : ",", n * 4.0 / (1 << 20));
    }
    nBuckets = bufs.size();
    auto arTimes = timeSteps(3, 10, dev, [&] {
      std::vector<tessera::WorkPtr> works;
      for (auto& b : bufs) works.push_back(ctx.world->allReduce(b));
      for (auto& w : works) w->wait();
    });
    allreduceMs = median(arTimes) * 1e3;
  }

  const double tokens = static_cast<double>(batch * cfg.seqLen * world);
  const double tps = tokens / med;
  const double mfu = tps * tessera::bench::gptFlopsPerToken(cfg) / (world * 989e12);
  std::string allMs;
  for (double t : times) allMs += fmt::format("{}{:.2f}", allMs.empty() ? "" : ", ", t * 1e3);
  std::string system = mode == "single" ? "tessera-single" : bucketView ? "tessera-ddp-bucketview" : "tessera-ddp";
  if (auto name = std::getenv("BENCH_SYSTEM")) system = name;  // variants of one mode (run.sh)
  if (rank == 0) {
    std::cout << fmt::format(
                     "RESULT {{\"system\": \"{}\", \"mode\": \"{}\", \"world\": {}, \"params_M\": {:.1f}, "
                     "\"step_ms\": {:.2f}, \"tokens_per_s\": {:.0f}, \"mfu_vs_989\": {:.3f}, \"peak_mem_GiB\": {:.2f}, "
                     "\"allreduce_ms\": {:.2f}, \"buckets\": {}, \"bucket_mib\": \"{}\", \"zero_grad\": \"{}\", "
                     "\"step_ms_all\": [{}]}}",
                     system, mode, world, tessera::bench::gptParamCount(cfg) / 1e6, med * 1e3, tps, mfu, peakGiB,
                     allreduceMs, nBuckets, bucketMib, setToNone ? "set_to_none" : "ddp.zeroGrad (in place)",
                     allMs)
              << std::endl;
  }
  if (ddp) ctx.world->barrier()->wait();
  torch::cuda::synchronize(dev);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "ddp_bench: error: " << e.what() << std::endl;
  return 1;
}
