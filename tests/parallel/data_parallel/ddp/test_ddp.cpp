// DistributedDataParallel on Gloo against single-process training: 2 and 4 ranks, a tiny MLP
// and a tiny GPT, 5 SGD (momentum) steps, different data on every rank.
//
// Tolerances: in fp32 the only difference from the reference is the order in which the
// per-rank gradient contributions are summed (mean of per-rank means vs one mean), a relative
// error of a few float32 ulps (~1e-7) per gradient; 5 steps of lr 0.05 with momentum 0.9
// scale that by < 10 x lr, so parameters agree to well under 1e-5 (the bound used). With
// bf16 communication each gradient is rounded to bf16 (relative <= 2^-8 ~ 4e-3) before the
// sum, so the deviation is at most ~4e-3 of how far training moved the parameters (~0.04 in
// these 5 steps: ~1.5e-4; measured 1.2e-4): the bound used there is 5e-4. Each run also
// checks that training moved the parameters by more than 50x its tolerance.
// Across ranks the parameters must be bitwise identical.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <limits>
#include <map>

#include "harness/args.h"
#include "harness/multiprocess.h"
#ifdef TESSERA_DDP_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif
#include "models/tiny_models.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/nn/recompute.h"
#include "tessera/nn/stale_grads.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

constexpr int kSteps = 5;
constexpr int64_t kBatch = 4;

// A model, its batches and loss behind one interface so one trainer serves MLP and GPT.
struct Task {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(int step, int micro, int rank)> lossOn;      // one rank's micro-batch
  std::function<at::Tensor(int step, int accum, int world)> refLoss;    // every rank, every micro
};

Task makeTask(const std::string& model, uint64_t seed, bool skipFc2, const at::Device& dev, bool fused = false,
              bool recomputed = false) {
  Task t;
  if (model == "gpt") {
    auto m = makeTinyGpt(seed);
    m->to(dev);
    t.module = m.ptr();
    t.lossOn = [m, dev](int step, int micro, int rank) mutable {
      auto b = gptBatch(1000 * step + micro, rank, kBatch, {}, dev);
      return gptLoss(m->forward(b.tokens), b.targets);
    };
    t.refLoss = [m, dev](int step, int accum, int world) mutable {
      std::vector<at::Tensor> tok, tgt;
      for (int k = 0; k < accum; ++k) {
        auto b = concatGptBatches(1000 * step + k, world, kBatch, {}, dev);
        tok.push_back(b.tokens);
        tgt.push_back(b.targets);
      }
      return gptLoss(m->forward(at::cat(tok)), at::cat(tgt));
    };
  } else {
    auto m = makeTinyMlp(seed);
    m->skipFc2 = skipFc2;
    if (fused) m->linearFn = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
      return nn::linearAccumulateGrad(x, w, b);
    };
    // The data does not require grad: the first recomputation's input is made to, as a block's
    // input (the embedding's output) does, or autograd would not record it at all.
    if (recomputed) m->linearFn = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
      const auto in = x.requires_grad() ? x : x.detach().requires_grad_(true);
      return nn::recompute([w, b](const at::Tensor& t) { return at::linear(t, w, b); }, in);
    };
    m->to(dev);
    t.module = m.ptr();
    t.lossOn = [m, dev, recomputed](int step, int micro, int rank) mutable {
      auto b = mlpBatch(1000 * step + micro, rank, kBatch, {}, dev);
      auto out = m->forward(b.x);
      const char* node = recomputed ? "Recomputed" : "AccumLinear";
      WCHECK(!m->linearFn || (out.grad_fn() && out.grad_fn()->name().find(node) != std::string::npos),
             "the output should come from {} but came from {}", node,
             out.grad_fn() ? out.grad_fn()->name() : "no graph");
      return mlpLoss(out, b.y);
    };
    t.refLoss = [m, dev](int step, int accum, int world) mutable {
      std::vector<at::Tensor> x, y;
      for (int k = 0; k < accum; ++k) {
        auto b = concatMlpBatches(1000 * step + k, world, kBatch, {}, dev);
        x.push_back(b.x);
        y.push_back(b.y);
      }
      return mlpLoss(m->forward(at::cat(x)), at::cat(y));
    };
  }
  return t;
}

torch::optim::SGD sgd(torch::nn::Module& m) {
  return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

// torch::optim::SGD's momentum step (dampening 0, no Nesterov, no weight decay), op for op, on
// whichever parameters it is given: the optimizer DDP's onBucketReduced runs bucket by bucket.
struct MomentumSgd {
  double lr = 0.05, momentum = 0.9;
  std::map<const void*, at::Tensor> bufs;
  int64_t stepped = 0;  // parameters stepped so far
  void step(const std::vector<at::Tensor>& params) {
    at::NoGradGuard ng;
    for (const auto& p : params) {
      auto& buf = bufs[p.unsafeGetTensorImpl()];
      const auto& g = p.grad();
      if (!buf.defined()) {
        buf = g.clone().detach();
      } else {
        buf.mul_(momentum).add_(g, 1.0);
      }
      p.add_(buf, -lr);
      ++stepped;
    }
  }
};

at::Tensor flatParams(torch::nn::Module& m) {
  std::vector<at::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p.detach().reshape({-1}));
  return at::cat(v);
}

}  // namespace

// arg: model=mlp|gpt; view=0|1; comm=fp32|bf16; cap=<bytes>; accum=<k>; unused=0|1; dev=cpu|cuda;
// fused=0|1 (the MLP's linears sum weight gradients into .grad inside the GEMM,
// nn::linearAccumulateGrad: DDP's hooks must still see them; the reference uses at::linear);
// optov=1 (the optimizer steps each bucket's parameters from onBucketReduced during backward
// instead of after it: the same parameters, every parameter stepped once per step);
// stale=1 (overwriteStaleGrads: zeroGrad() only marks, and this test then fills every .grad with
// NaN, the garbage a stale gradient may hold: none of it may reach the result); defer=1 (every
// micro-batch's backward under noSync with its weight gradients deferred, nn/deferred_grads.h,
// run after it, then reduceGradients(): a zero-bubble pipeline's order); recompute=1 (each of the
// MLP's linears recomputed in backward, nn/recompute.h: every gradient comes from a nested
// backward, and DDP's end of backward must wait for the whole one)
TESSERA_WORKER(ddp_train) {
  auto a = parseArgs(w.arg);
  auto get = [&](const char* k, const char* d) { return a.count(k) ? a[k] : std::string(d); };
  const std::string model = get("model", "mlp");
  const int accum = std::stoi(get("accum", "1"));
  const bool unused = get("unused", "0") == "1";
  const bool cuda = get("dev", "cpu") == "cuda";
  auto ctx = initWorker(w, cuda ? Backend::Nccl : Backend::Gloo);
  const auto dev = ctx.device;

  DdpOptions o;
  o.gradientAsBucketView = get("view", "0") == "1";
  if (get("comm", "fp32") == "bf16") o.commDtype = at::kBFloat16;
  if (a.count("cap")) o.bucketCapBytes = o.firstBucketCapBytes = std::stoul(a["cap"]);
  o.findUnusedParameters = unused;
  o.smCarveout = std::stoi(get("carve", "0"));
  o.overwriteStaleGrads = get("stale", "0") == "1";
  const bool defer = get("defer", "0") == "1";
  const bool optov = get("optov", "0") == "1";
  MomentumSgd inBackward;
  if (optov) o.onBucketReduced = [&inBackward](const std::vector<at::Tensor>& ps) { inBackward.step(ps); };

  // Every rank starts from a different init: DDP must broadcast rank 0's (seed 100).
  auto task = makeTask(model, 100 + w.rank, unused, dev, get("fused", "0") == "1", get("recompute", "0") == "1");
  DistributedDataParallel ddp(namedParameters(*task.module), namedBuffers(*task.module), ctx.world, o);
  // A group of one communicates nothing: no buckets (the gradients are the average already),
  // unless the optimizer runs per bucket or stale gradients are resolved at the end of backward.
  WCHECK((w.world == 1 && !optov && !o.overwriteStaleGrads) == ddp.bucketLayout().empty(), "world {}: {} buckets", w.world,
         ddp.bucketLayout().size());
  auto opt = sgd(*task.module);
  int64_t trained = 0;
  for (const auto& p : task.module->parameters()) trained += p.requires_grad() ? 1 : 0;
  for (int step = 0; step < kSteps; ++step) {
    ddp.zeroGrad();
    if (o.overwriteStaleGrads) {
      size_t withGrad = 0;
      for (auto& p : task.module->parameters()) {
        if (!p.grad().defined()) continue;
        ++withGrad;
        WCHECK(nn::isStale(p), "step {}: a parameter's .grad is defined but not marked stale", step);
        p.mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
      }
      WCHECK(step == 0 || withGrad > 0, "step {}: no gradient to mark", step);
    }
    for (int k = 0; k < accum; ++k) {
      auto loss = task.lossOn(step, k, w.rank) / accum;
      if (defer) {
        nn::WeightGradQueue q;
        {
          auto guard = ddp.noSync();
          nn::DeferWeightGrads scope(q);
          loss.backward();
        }
        q.run();
        if (k + 1 == accum) ddp.reduceGradients();
      } else if (k + 1 < accum) {
        auto guard = ddp.noSync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    WCHECK(nn::staleCount() == 0, "step {}: {} stale gradient(s) left after backward", step, nn::staleCount());
    if (optov) {
      WCHECK(inBackward.stepped == (step + 1) * trained, "step {}: {} parameter steps from onBucketReduced, want {}",
             step, inBackward.stepped, (step + 1) * trained);
    } else {
      opt.step();
    }
  }

  // Single-process reference: rank 0's init, one step per iteration on every rank's data.
  auto ref = makeTask(model, 100, unused, dev);
  auto refOpt = sgd(*ref.module);
  for (int step = 0; step < kSteps; ++step) {
    refOpt.zero_grad();
    ref.refLoss(step, accum, w.world).backward();
    refOpt.step();
  }
  auto mine = flatParams(*task.module), want = flatParams(*ref.module);
  double tol = o.commDtype ? 5e-4 : 1e-5;
  double diff = (mine - want).abs().max().item<double>();
  double moved = (want - flatParams(*makeTask(model, 100, unused, dev).module)).abs().max().item<double>();
  fmt::print("rank {}: max |ddp - reference| = {:.3g} (tolerance {:.0e}); training moved params by up to {:.3g}\n",
             w.rank, diff, tol, moved);
  WCHECK(moved > 50 * tol, "training barely moved the parameters ({}): the comparison would prove nothing", moved);
  WCHECK(diff <= tol, "parameters differ from single-process training by {} > {}", diff, tol);

  // Bitwise identical on every rank.
  auto all = at::empty({w.world * mine.numel()}, mine.options());
  ctx.world->allGather(all, mine)->synchronize();
  auto rows = all.view({w.world, mine.numel()});
  for (int r = 1; r < w.world; ++r) WCHECK(rows[r].equal(rows[0]), "rank {}'s parameters differ from rank 0's", r);
}

struct DdpCase {
  int ranks;
  const char* arg;
};

void PrintTo(const DdpCase& c, std::ostream* os) { *os << c.ranks << " ranks, " << c.arg; }

class DdpTraining : public ::testing::TestWithParam<DdpCase> {};

#ifdef TESSERA_DDP_GPU_SUITE
// The same checks on NCCL with CUDA tensors (2 GPUs): the multi-tensor CUDA copy kernels,
// stream-ordered waits and the NCCL communicator under the reducer.
TEST_P(DdpTraining, MatchesSingleProcessAndRanksAgreeOnGpus) {
  TESSERA_REQUIRE_GPUS(2);
  auto c = GetParam();
  auto o = gpuRun(300);
  o.arg = std::string(c.arg) + ";dev=cuda";
  expectAllOk(runWorkers("ddp_train", o));
}

// One GPU, a group of one: the optimizer per bucket on its side stream (no communication, the
// stream ordering alone) against single-process training.
TEST(DdpGpu, OptimizerPerBucketOnOneGpu) {
  TESSERA_REQUIRE_GPUS(1);
  for (const char* arg : {"model=gpt;cap=4096;optov=1;dev=cuda", "model=gpt;cap=4096;view=1;optov=1;dev=cuda"}) {
    auto o = gpuRun(300);
    o.ranks = 1;
    o.arg = arg;
    expectAllOk(runWorkers("ddp_train", o));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, DdpTraining,
    ::testing::Values(DdpCase{2, "model=gpt"}, DdpCase{2, "model=gpt;view=1"}, DdpCase{2, "model=gpt;comm=bf16"},
                      DdpCase{2, "model=gpt;cap=512;accum=2"}, DdpCase{2, "model=mlp;unused=1"},
                      DdpCase{2, "model=gpt;carve=16"}, DdpCase{2, "model=gpt;cap=512;carve=24;view=1"},
                      DdpCase{2, "model=gpt;cap=4096;optov=1"}, DdpCase{2, "model=gpt;cap=4096;view=1;optov=1"},
                      DdpCase{2, "model=mlp;fused=1;accum=2;view=1;stale=1"}));
#else
TEST_P(DdpTraining, MatchesSingleProcessAndRanksAgree) {
  auto c = GetParam();
  expectAllOk(runWorkers("ddp_train", {.ranks = c.ranks, .timeout = std::chrono::seconds(180), .arg = c.arg}));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DdpTraining,
    ::testing::Values(DdpCase{1, "model=gpt"}, DdpCase{2, "model=mlp"}, DdpCase{4, "model=mlp"}, DdpCase{2, "model=gpt"},
                      DdpCase{4, "model=gpt"}, DdpCase{2, "model=gpt;view=1"}, DdpCase{2, "model=gpt;comm=bf16"},
                      DdpCase{3, "model=gpt;cap=512"}, DdpCase{2, "model=mlp;accum=3"},
                      DdpCase{2, "model=gpt;accum=2;view=1"}, DdpCase{2, "model=mlp;unused=1"},
                      DdpCase{2, "model=mlp;unused=1;view=1"}, DdpCase{2, "model=mlp;fused=1"},
                      DdpCase{2, "model=mlp;fused=1;accum=3;view=1;cap=512"},
                      // The optimizer per bucket during backward: small buckets (several per step), bucket
                      // views or copies, bf16 communication, accumulation, and a group of one.
                      DdpCase{2, "model=gpt;cap=4096;optov=1"}, DdpCase{2, "model=gpt;cap=4096;view=1;optov=1"},
                      DdpCase{2, "model=mlp;comm=bf16;optov=1"}, DdpCase{2, "model=mlp;accum=3;fused=1;optov=1"},
                      DdpCase{1, "model=gpt;optov=1"},
                      // Stale gradients: overwritten by the GEMMs (fused), zeroed before autograd adds
                      // (gpt), unused (zeroed at the end), accumulation, deferred weight gradients.
                      DdpCase{1, "model=mlp;fused=1;stale=1"}, DdpCase{1, "model=gpt;stale=1;accum=2"},
                      DdpCase{2, "model=mlp;fused=1;accum=3;view=1;stale=1"}, DdpCase{2, "model=gpt;view=1;stale=1"},
                      DdpCase{2, "model=mlp;unused=1;fused=1;view=1;stale=1"}, DdpCase{2, "model=mlp;comm=bf16;fused=1;stale=1"},
                      DdpCase{2, "model=mlp;fused=1;accum=2;defer=1;view=1;stale=1"},
                      DdpCase{2, "model=mlp;recompute=1"}, DdpCase{1, "model=mlp;recompute=1;stale=1;accum=2"}));
#endif
