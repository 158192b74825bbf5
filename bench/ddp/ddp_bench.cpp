// tessera's side of the DDP benchmark: the benchmarks' GPT-735M (common/bench_model.h: src/models'
// GPT, the trainer's) trained as ../shared/anchors/torch_anchor.py trains it (bf16 autocast
// forward, fp32 parameters, fused AdamW lr 1e-4, random tokens, batch B per GPU, WARM=3 warm-ups
// then the median of STEPS=10 steps, each step between two device synchronisations).
//   single : one process, no DDP          (torchrun --nproc_per_node=1 --no-python BIN single)
//   tessera: tessera::DistributedDataParallel over tessera::init()'s world, default options
//            (torchrun --nproc_per_node=2 --no-python BIN tessera [--bucket-view])
// --variants LIST runs several configurations one after the other in the same process (same
// model and data; a fresh DDP and optimizer each): a comma-separated list of "base" or
// '+'-joined parts "view" (bucket views), "bf16" (bf16 gradient communication), "carve<N>" (N SMs
// kept free of backward's GEMMs while buckets are in flight, common/sm_carveout.h; in single
// mode over the whole step), "fused" (the model's linears sum their weight gradients in fp32 in
// the GEMM, nn::linearAccumulateGrad: into the bucket itself with "view"), "optov" (the optimizer
// steps each bucket's parameters as soon as its all-reduce is done, during backward:
// DdpOptions::onBucketReduced; tessera mode only). Each prints its own RESULT line, its system named
// <tessera-ddp|tessera-single|BENCH_SYSTEM>-<variant> ("base": no suffix).
// --bucket-view sets DdpOptions::gradientAsBucketView (gradients then zeroed in place; without
// it gradients are set to None after each step, as the anchor's zero_grad(set_to_none=True)).
// Env (read at the top) as the anchor: B, STEPS, D, L, V, T (a smaller model for a smoke test);
// TESSERA_FAKE_WORLD=N: the one-GPU probe without communication (common/fake_world.h), tessera
// mode as rank 0 of N; BENCH_SYSTEM: the rows' name.
// In tessera mode it then times the all-reduce of the gradients alone: every bucket of
// ddp.bucketLayout() (fp32, the same sizes) launched back to back, then waited, no backward;
// median of 10 after 3 warm-ups ("allreduce_ms"); the combiner turns it into the
// hidden-communication estimate.
// Rank 0 prints one line per variant: RESULT {json} (common/timing.h) plus variant, allreduce_ms,
// buckets, first_loss (the first step's, before any update) and last_loss.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_model.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/sm_carveout.h"
#include "fake_world.h"
#include "fused_adamw.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "tessera/parallel/tensor/linear.h"
#include "timing.h"

namespace bench = tessera::bench;

namespace {

// One configuration of a run: "base", or '+'-joined parts "view" (gradientAsBucketView),
// "bf16" (commDtype bf16), "carve<N>" (N SMs kept free of GEMMs while buckets are in flight;
// in single mode: during the whole step, to see what the carveout itself costs).
struct Variant {
  std::string name;
  bool bucketView = false, commBf16 = false, fusedWgrad = false;
  int carveout = 0;
  bool optimizerInBackward = false;  // "optov": DdpOptions::onBucketReduced steps each bucket's parameters
};

Variant parseVariant(const std::string& spec) {
  Variant v{spec};
  for (const auto& part : bench::splitList(spec, '+')) {
    if (part == "view") {
      v.bucketView = true;
    } else if (part == "bf16") {
      v.commBf16 = true;
    } else if (part == "fused") {
      v.fusedWgrad = true;
    } else if (part == "optov") {
      v.optimizerInBackward = true;
    } else if (auto n = bench::numberedPart(part, "carve")) {
      v.carveout = *n;
    } else {
      TESSERA_CHECK(part == "base", "ddp_bench: unknown variant part '{}' in '{}' (base, view, bf16, fused, optov, carve<N>)", part,
                    spec);
    }
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string mode = argc > 1 ? argv[1] : "";
  bool bucketView = false, commBf16 = false;
  std::string variantList;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--variants" && i + 1 < argc) {
      variantList = argv[++i];
      continue;
    }
    TESSERA_CHECK(a == "--bucket-view" || a == "--comm-bf16", "ddp_bench: unknown argument {}", a);
    (a == "--bucket-view" ? bucketView : commBf16) = true;
  }
  TESSERA_CHECK(mode == "single" || mode == "tessera",
                "usage: {} single|tessera [--bucket-view] [--comm-bf16] [--variants base,view,bf16,carve8,...]",
                argv[0]);
  std::vector<Variant> variants;
  if (variantList.empty()) {
    variants.push_back(Variant{"base", bucketView, commBf16, false, 0});
  } else {
    for (const auto& spec : bench::splitList(variantList, ',')) variants.push_back(parseVariant(spec));
  }
  const auto cfg = bench::modelFromEnv();
  const int64_t batch = bench::envInt("B", 8);
  const int steps = static_cast<int>(bench::envInt("STEPS", 10));
  const auto fake = bench::fakeWorldFromEnv();
  const char* systemName = std::getenv("BENCH_SYSTEM");  // variants of one mode (run.sh)

  tessera::Context ctx;
  int rank = 0, world = 1;
  torch::Device device = bench::singleProcessDevice();
  if (mode == "tessera") {
    ctx = bench::initWorld(fake);  // CUDA with NCCL where there are GPUs, else CPU with Gloo (smoke runs)
    rank = ctx.world->rank();
    world = ctx.world->size();
    device = ctx.device;
  } else {
    TESSERA_CHECK(bench::envInt("WORLD_SIZE", 1) == 1, "ddp_bench: single mode runs one process");
    TESSERA_CHECK(fake.size == 0, "ddp_bench: single mode has no world to fake (TESSERA_FAKE_WORLD={})", fake.size);
  }
  bench::useDevice(device);
  const bool gpu = device.is_cuda();

  // The whole model on every rank, in a tensor-parallel group of one.
  const auto tp = bench::selfGroup(device);
  auto model = bench::buildModel(cfg, tp, tessera::models::ChunkRange::whole(cfg));
  model->to(device);
  at::Tensor x, y;
  std::tie(x, y) = bench::randomBatch(cfg, batch, bench::kDataSeed + rank, device);

  std::string baseName = mode == "single" ? "tessera-single" : "tessera-ddp";
  if (variantList.empty() && bucketView) baseName = "tessera-ddp-bucketview";
  if (systemName) baseName = systemName;
  bool firstVariant = true;
  for (const auto& v : variants) {
    TESSERA_CHECK(!v.optimizerInBackward || mode == "tessera",
                  "ddp_bench: variant '{}': optov (the optimizer per DDP bucket) needs mode tessera", v.name);
    std::unique_ptr<tessera::DistributedDataParallel> ddp;
    bench::FusedAdamW opt(model->parameters());
    if (mode == "tessera") {
      tessera::DdpOptions o;
      o.gradientAsBucketView = v.bucketView;
      if (v.commBf16) o.commDtype = at::kBFloat16;
      o.smCarveout = v.carveout;
      if (v.optimizerInBackward) o.onBucketReduced = [&opt](const std::vector<at::Tensor>& ps) { opt.step(ps); };
      tessera::DistributedDataParallel::Named params;
      for (const auto& p : model->params()) params.emplace_back(p.name, p.tensor);
      ddp = std::make_unique<tessera::DistributedDataParallel>(params, tessera::DistributedDataParallel::Named{},
                                                               ctx.world, o);
    }
    tessera::tp::setAccumulateGradInGemm(*model, v.fusedWgrad);
    const bool setToNone = !v.bucketView;

    bench::resetPeakMemory(device);
    torch::Tensor firstLoss, lastLoss;
    auto times = bench::timeSteps(bench::kWarmSteps, steps, device, [&] {
      // Single mode: the carveout over the whole step (its cost without any communication).
      tessera::SmCarveoutGuard carve(ddp ? 0 : v.carveout);
      torch::Tensor loss;
      {
        tessera::Bf16Autocast autocast(gpu);
        loss = tessera::models::lmLoss(model->forward(x), y, tp, cfg.vocab);
      }
      loss.backward();
      if (!v.optimizerInBackward) opt.step();  // else stepped bucket by bucket during backward
      lastLoss = loss.detach();
      if (!firstLoss.defined()) firstLoss = lastLoss;
      if (ddp && !setToNone) ddp->zeroGrad();
      else opt.zeroGrad(setToNone);
    }, rank);
    const double peakGiB = bench::peakMemoryGiB(device);

    // The gradients' all-reduce alone, bucket by bucket as the reducer lays them out (once).
    double allreduceMs = 0;
    size_t nBuckets = 0;
    std::string bucketMib;
    if (ddp && firstVariant) {
      std::map<std::string, int64_t> numel;
      for (const auto& p : model->params()) numel[p.name] = p.tensor.numel();
      std::vector<at::Tensor> bufs;
      for (const auto& names : ddp->bucketLayout()) {
        int64_t n = 0;
        for (const auto& nm : names) n += numel.at(nm);
        bufs.push_back(at::zeros({n}, at::TensorOptions().device(device).dtype(at::kFloat)));
        bucketMib += fmt::format("{}{:.1f}", bucketMib.empty() ? "" : ",", n * 4.0 / (1 << 20));
      }
      nBuckets = bufs.size();
      auto arTimes = bench::timeSteps(bench::kWarmSteps, 10, device, [&] {
        std::vector<tessera::WorkPtr> works;
        for (auto& b : bufs) works.push_back(ctx.world->allReduce(b));
        for (auto& w : works) w->wait();
      }, /*profileRank=*/-1);
      allreduceMs = bench::median(arTimes) * 1e3;
    }
    firstVariant = false;

    std::string system = v.name == "base" ? baseName : baseName + "-" + v.name;
    std::string extra =
        fmt::format("\"variant\": \"{}\", \"sm_carveout\": {}, \"fused_wgrad\": {}, \"optimizer_in_backward\": {}, "
                    "\"zero_grad\": \"{}\"",
                    v.name, v.carveout, v.fusedWgrad, v.optimizerInBackward,
                    setToNone ? "set_to_none" : "ddp.zeroGrad (in place)");
    extra += fmt::format(", \"first_loss\": {}, \"last_loss\": {}", bench::jsonNumber(firstLoss.item<double>()),
                         bench::jsonNumber(lastLoss.item<double>()));
    if (allreduceMs > 0) {
      extra += fmt::format(", \"allreduce_ms\": {:.2f}, \"buckets\": {}, \"bucket_mib\": \"{}\"", allreduceMs,
                           nBuckets, bucketMib);
    }
    bench::BenchResult r{system, mode, world, static_cast<double>(batch * cfg.seqLen * world), times, peakGiB, extra};
    if (rank == 0) std::cout << bench::resultLine(cfg, r, fake) << std::endl;
    opt.zeroGrad(/*setToNone=*/true);  // the next variant starts without gradients or bucket views
  }
  if (mode == "tessera") ctx.world->barrier()->wait();
  bench::synchronize(device);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "ddp_bench: error: " << e.what() << std::endl;
  return 1;
}
