// FP8 on real codes in the tensor-parallel linears (parallel/tensor/fp8_linear.h): a column layer
// and a row layer, each alone, over tp = 1, 2 and 4, plain and sequence parallel, for both
// recipes, against the recipe written out on the unsharded tensors with the CPU emulation
// (fp8::fakeQuantize): output, input gradient, weight and bias gradient shards. Each layer gets
// exact inputs, so every code equals the emulation's (the amaxes of the whole tensors, all-reduced
// over tp); what differs is the GEMMs' summation. The row layer sums its weight gradient into
// .grad in the GEMM (accumulateGrad).
//   test_tp_fp8_codes (CI): Gloo ranks call fp8ParallelLinear on CPU tensors (kernels/fp8.h's CPU
//     reference: the codes bit for bit, float32 GEMMs of the decoded values): within 1e-5 of the
//     largest value. This is the check of the amax groups: W's amax taken locally instead of over
//     tp (tried on purpose) moved the column output by 6e-5 of its largest value and failed it.
//   test_tp_fp8_gpu: the layers themselves on NCCL, one GPU per rank (the cast kernels and
//     cuBLASLt's FP8 GEMMs, the forward's fast accumulation among them): within 3e-3, the bound of
//     Hopper's FP8 accumulation; too loose for that mistake, which the CPU suite catches, and the
//     kernels are checked bit for bit on their own (test_kernels_gpu's Fp8Gpu).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#ifdef TESSERA_TP_FP8_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif
#include "tessera/fp8/fake_quant.h"
#include "harness/multiprocess.h"
#include "tessera/nn/deferred_grads.h"
#include "parallel/tensor/fp8_linear.h"
#include "parallel/tensor/fp8_weight_cache.h"
#include "tessera/parallel/tensor/linear.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t IN = 32, H = 64, OUT = 48, S = 16, B = 2;  // every GEMM dimension a multiple of 16
#ifdef TESSERA_TP_FP8_GPU_SUITE
constexpr bool kGpu = true;
constexpr double kBound = 3e-3;
#else
constexpr bool kGpu = false;
constexpr double kBound = 1e-5;
#endif

at::Tensor seeded(std::vector<int64_t> shape, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g);
}

void expectClose(const at::Tensor& gotAnywhere, const at::Tensor& want, const std::string& what) {
  WCHECK(gotAnywhere.defined(), "{}: missing", what);
  const auto got = gotAnywhere.detach().cpu().to(at::kFloat);
  WCHECK(got.sizes() == want.sizes(), "{}: shape [{}] vs [{}]", what, fmt::join(got.sizes(), ","),
         fmt::join(want.sizes(), ","));
  const double d = (got - want).abs().max().item<double>(), top = want.abs().max().item<double>();
  WCHECK(d <= kBound * top + 1e-6, "{}: max |diff| = {} (largest value {})", what, d, top);
}

using fp8::Axis;
using fp8::Format;
at::Tensor fq(const at::Tensor& t, Format f, Axis a) { return fp8::fakeQuantize(t, f, a); }

// The recipe on one unsharded linear (x2 [m, in], W [out, in], gy2 [m, out]) with the emulation:
// its output, input gradient and weight gradient.
struct Ref {
  at::Tensor y, gx, gW;
};
Ref onUnsharded(const at::Tensor& x2, const at::Tensor& W, const at::Tensor& b, const at::Tensor& gy2,
                bool tensorwise) {
  const auto fwd = tensorwise ? Axis::Tensor : Axis::Rows;
  auto xq = fq(x2, Format::E4M3, fwd), wq = fq(W, Format::E4M3, fwd), gq = fq(gy2, Format::E5M2, fwd);
  return {at::addmm(b, xq, wq.t()), gq.mm(tensorwise ? wq : fq(W, Format::E4M3, Axis::Cols)),
          tensorwise ? gq.t().mm(xq) : gy2.t().mm(x2)};
}
// A column layer IN → H and a row layer H → OUT on `dev`, loaded from two seeded torch Linears
// (kept for the reference), with the given options.
struct Pair {
  torch::nn::Linear full1{nullptr}, full2{nullptr};
  tp::ColumnParallelLinear col{nullptr};
  tp::RowParallelLinear row{nullptr};
};
Pair makePair(const CommPtr& tp, const at::Device& dev, tp::ParallelLinearOptions co, tp::ParallelLinearOptions ro) {
  torch::manual_seed(7);
  Pair p{torch::nn::Linear(IN, H), torch::nn::Linear(H, OUT)};
  co.initFromRng = ro.initFromRng = false;
  p.col = tp::ColumnParallelLinear(tp, IN, H, co);
  p.row = tp::RowParallelLinear(tp, H, OUT, ro);
  p.col->loadFull(p.full1->weight, p.full1->bias);
  p.row->loadFull(p.full2->weight, p.full2->bias);
  p.col->to(dev);
  p.row->to(dev);
  return p;
}
}  // namespace

// arg: "tensorwise" | "rowwise", "_sp" for sequence parallel.
TESSERA_WORKER(tp_fp8_codes) {
  std::string mode = w.arg;
  const bool sp = mode.size() > 3 && mode.substr(mode.size() - 3) == "_sp";
  if (sp) mode = mode.substr(0, mode.size() - 3);
  const auto recipe = fp8::parseRecipe(mode);
  const bool tensorwise = recipe == fp8::Recipe::Tensorwise;
  auto ctx = initWorker(w, kGpu ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;
  const int64_t p = tp->size(), r = tp->rank();

  tp::ParallelLinearOptions co, ro;
  co.name = "fc1", ro.name = "fc2";
  co.sequenceParallel = ro.sequenceParallel = sp && p > 1;
  co.fp8 = ro.fp8 = recipe;
  ro.accumulateGradInGemm = true;
  auto pair = makePair(tp, dev, co, ro);
  auto &full1 = pair.full1, &full2 = pair.full2;
  auto& col = pair.col;
  auto& row = pair.row;
  const bool seqSplit = co.sequenceParallel;
  auto tokens = [&](const at::Tensor& t) { return seqSplit ? t.chunk(p, 0)[r].contiguous() : t; };
  auto features = [&](const at::Tensor& t) { return t.chunk(p, -1)[r].contiguous(); };
  const std::string where = fmt::format("{}{} tp {} rank {}", mode, seqSplit ? " sp" : "", p, r);
  // The layers dispatch to the FP8 GEMMs for CUDA tensors; on the CPU the op itself is called.
  auto viaCol = [&](const at::Tensor& x) {
    if (kGpu) return col(x);
    return tp::fp8ParallelLinear(x, col->weight, col->bias, {tp::Fp8Parallel::Column, tp, seqSplit, false, recipe});
  };
  auto viaRow = [&](const at::Tensor& x) {
    if (kGpu) return row(x);
    return tp::fp8ParallelLinear(x, row->weight, row->bias, {tp::Fp8Parallel::Row, tp, seqSplit, true, recipe});
  };

  {  // Column: x [S, B, IN] (its token shard with sp) → [S, B, H/p].
    const auto x = seeded({S, B, IN}, 11), gy = seeded({S, B, H}, 12);
    auto xin = tokens(x).to(dev).requires_grad_(true);
    auto y = viaCol(xin);
    (y * features(gy).to(dev)).sum().backward();
    auto x2 = x.reshape({-1, IN}), gy2 = gy.reshape({-1, H});
    auto W1 = full1->weight.detach(), b1 = full1->bias.detach();
    const auto ref = onUnsharded(x2, W1, b1, gy2, tensorwise);
    expectClose(y, features(ref.y.view({S, B, H})), where + " column output");
    expectClose(xin.grad(), tokens(ref.gx.view({S, B, IN})), where + " column input gradient");
    expectClose(col->weight.grad(), ref.gW.chunk(p, 0)[r], where + " column weight gradient");
    expectClose(col->bias.grad(), gy2.sum(0).chunk(p, 0)[r], where + " column bias gradient");
    auto plain = at::addmm(b1, x2, W1.t());
    WCHECK((features(plain.view({S, B, H})) - y.detach().cpu()).abs().max().item<double>() > 1e-3,
           "{}: the column output equals the float32 layer's (FP8 not applied)", where);
  }
  {  // Row: h [S, B, H/p] (features split) → [S, B, OUT] (its token shard with sp).
    const auto h = seeded({S, B, H}, 13), gy = seeded({S, B, OUT}, 14);
    auto hin = features(h).to(dev).requires_grad_(true);
    auto y = viaRow(hin);
    (y * tokens(gy).to(dev)).sum().backward();
    auto h2 = h.reshape({-1, H}), gy2 = gy.reshape({-1, OUT});
    auto W2 = full2->weight.detach(), b2 = full2->bias.detach();
    const auto ref = onUnsharded(h2, W2, b2, gy2, tensorwise);
    expectClose(y, tokens(ref.y.view({S, B, OUT})), where + " row output");
    expectClose(hin.grad(), features(ref.gx.view({S, B, H})), where + " row input gradient");
    expectClose(row->weight.grad(), ref.gW.chunk(p, 1)[r], where + " row weight gradient (summed in the GEMM)");
    expectClose(row->bias.grad(), gy2.sum(0), where + " row bias gradient");
  }
}

// The step's weight-code cache (fp8_weight_cache.h): two micro-batches through a column and a row
// layer inside an Fp8WeightCacheScope give exactly what they give without it, and the cache
// answered every cast after the first (tensorwise: the backward's and the second micro-batch's,
// 3 per layer; rowwise: the second micro-batch's forward and backward, 2 per layer).
TESSERA_WORKER(tp_fp8_cache) {
  const auto recipe = fp8::parseRecipe(w.arg);
  auto ctx = initWorker(w, kGpu ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;
  const int64_t p = tp->size(), r = tp->rank();
  tp::ParallelLinearOptions co, ro;
  co.fp8 = ro.fp8 = recipe;
  auto pair = makePair(tp, dev, co, ro);
  auto &full1 = pair.full1, &full2 = pair.full2;
  auto& col = pair.col;
  auto& row = pair.row;
  auto run = [&] {
    std::vector<at::Tensor> outs;
    for (auto* p : {&col->weight, &col->bias, &row->weight, &row->bias}) p->mutable_grad() = at::Tensor();
    for (int mb = 0; mb < 2; ++mb) {
      auto x = seeded({S, B, IN}, 21 + mb).to(dev).requires_grad_(true);  // both layers' input gradients
      auto h = tp::fp8ParallelLinear(x, col->weight, col->bias, {tp::Fp8Parallel::Column, tp, false, false, recipe});
      auto y = tp::fp8ParallelLinear(h, row->weight, row->bias, {tp::Fp8Parallel::Row, tp, false, false, recipe});
      (y * seeded({S, B, OUT}, 31 + mb).to(dev)).sum().backward();
      outs.push_back(y.detach().cpu());
      outs.push_back(x.grad().cpu());
    }
    for (auto* p : {&col->weight, &col->bias, &row->weight, &row->bias}) outs.push_back(p->grad().cpu());
    return outs;
  };
  const auto plain = run();
  std::vector<at::Tensor> cached;
  int64_t hits = 0;
  {
    tp::Fp8WeightCacheScope scope;
    cached = run();
    hits = tp::Fp8WeightCacheScope::hits();
  }
  const int64_t want = recipe == fp8::Recipe::Tensorwise ? 6 : 4;
  WCHECK(hits == want, "{} tp {} rank {}: {} cache hits, expected {}", w.arg, p, r, hits, want);
  for (size_t i = 0; i < plain.size(); ++i) {
    const double d = (plain[i] - cached[i]).abs().max().item<double>();
    WCHECK(kGpu ? d <= 1e-6 * (1 + plain[i].abs().max().item<double>()) : at::equal(plain[i], cached[i]),
           "{} tp {} rank {}: tensor {} differs with the cache by {}", w.arg, p, r, i, d);
  }
}

// Zero bubble's split backward (nn/deferred_grads.h) with FP8: inside a DeferWeightGrads scope the
// layers' weight-gradient GEMMs (summed into .grad: accumulateGrad) are recorded, not run; running
// the queue afterwards gives bitwise the gradients of an ordinary backward, and before it the
// weights have none.
TESSERA_WORKER(tp_fp8_deferred) {
  const auto recipe = fp8::parseRecipe(w.arg);
  auto ctx = initWorker(w, kGpu ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;
  auto pair = makePair(tp, dev, {}, {});
  auto& col = pair.col;
  auto& row = pair.row;
  auto backward = [&] {
    for (auto* p : {&col->weight, &row->weight}) p->mutable_grad() = at::Tensor();
    auto x = seeded({S, B, IN}, 41).to(dev).requires_grad_(true);
    auto h = tp::fp8ParallelLinear(x, col->weight, {}, {tp::Fp8Parallel::Column, tp, false, true, recipe});
    auto y = tp::fp8ParallelLinear(h, row->weight, {}, {tp::Fp8Parallel::Row, tp, false, true, recipe});
    (y * seeded({S, B, OUT}, 42).to(dev)).sum().backward();
    return x.grad().cpu();
  };
  const auto gx = backward();
  const auto g1 = col->weight.grad().cpu(), g2 = row->weight.grad().cpu();
  nn::WeightGradQueue queue;
  at::Tensor gxDeferred;
  {
    nn::DeferWeightGrads defer(queue);
    gxDeferred = backward();
  }
  WCHECK(!col->weight.grad().defined() && !row->weight.grad().defined() && queue.size() == 2,
         "{}: the weight gradients ran inside the scope ({} recorded)", w.arg, queue.size());
  queue.run();
  WCHECK(at::equal(gx, gxDeferred), "{}: the input gradient changed when weight gradients were deferred", w.arg);
  WCHECK(at::equal(col->weight.grad().cpu(), g1) && at::equal(row->weight.grad().cpu(), g2),
         "{}: deferred weight gradients differ from the ordinary backward's", w.arg);
}

// Bad input to the op and the cache: clear errors naming what was wrong.
TESSERA_WORKER(tp_fp8_bad) {
  auto ctx = initWorker(w);
  const auto& tp = ctx.world;
  const auto w8 = at::randn({16, 32}), x = at::randn({4, 2, 32});
  const tp::Fp8LinearSpec spec{tp::Fp8Parallel::Column, tp, false, false, fp8::Recipe::Tensorwise};
  expectErrorContaining([&] { tp::fp8ParallelLinear(at::randn({4, 2, 24}), w8, {}, spec); },
                        {"fp8 linear", "rank 0", "W [out, in]", "[4, 2, 24]", "[16, 32]"});
  auto off = spec;
  off.recipe = fp8::Recipe::Off;
  expectErrorContaining([&] { tp::fp8ParallelLinear(x, w8, {}, off); }, {"fp8 linear", "recipe off"});
  auto none = spec;
  none.tp = nullptr;
  expectErrorContaining([&] { tp::fp8ParallelLinear(x, w8, {}, none); }, {"no tensor-parallel communicator"});
  tp::Fp8WeightCacheScope outer;
  expectErrorContaining([&] { tp::Fp8WeightCacheScope inner; }, {"Fp8WeightCacheScope", "already open"});
  tp::Fp8WeightCacheScope disabled(false);  // a scope that is off does not count as open
}

#ifdef TESSERA_TP_FP8_GPU_SUITE
class TpFp8Gpu : public ::testing::TestWithParam<std::string> {};
TEST_P(TpFp8Gpu, MatchesTheEmulatedRecipeOnUnshardedTensors) {
  for (int ranks : {1, 2, 4}) {
    if (tessera::cudaDeviceCount() < ranks) {
      fmt::print("SKIP: tp {} needs {} GPUs, {} visible\n", ranks, ranks, tessera::cudaDeviceCount());
      continue;
    }
    if (ranks == 1 && GetParam().find("_sp") != std::string::npos) continue;  // no sequence split over one rank
    auto o = gpuRun(240, {}, GetParam());
    o.ranks = ranks;
    expectAllOk(runWorkers("tp_fp8_codes", o));
  }
}
INSTANTIATE_TEST_SUITE_P(Recipes, TpFp8Gpu, ::testing::Values("tensorwise", "tensorwise_sp", "rowwise", "rowwise_sp"));
TEST(TpFp8Gpu, TheStepsWeightCacheChangesNothing) {
  TESSERA_REQUIRE_GPUS(2);
  for (const char* recipe : {"tensorwise", "rowwise"}) expectAllOk(runWorkers("tp_fp8_cache", gpuRun(120, {}, recipe)));
}
#else
class TpFp8Codes : public ::testing::TestWithParam<std::string> {};
TEST_P(TpFp8Codes, MatchesTheEmulatedRecipeOnUnshardedTensors) {
  for (int ranks : {1, 2, 4}) {
    if (ranks == 1 && GetParam().find("_sp") != std::string::npos) continue;  // no sequence split over one rank
    expectAllOk(runWorkers("tp_fp8_codes", {.ranks = ranks, .arg = GetParam()}));
  }
}
INSTANTIATE_TEST_SUITE_P(Recipes, TpFp8Codes,
                         ::testing::Values("tensorwise", "tensorwise_sp", "rowwise", "rowwise_sp"));
TEST(TpFp8Codes, BadInputIsAClearError) { expectAllOk(runWorkers("tp_fp8_bad", {.ranks = 1})); }
TEST(TpFp8Codes, DeferredWeightGradientsAreTheOrdinaryOnes) {
  for (const char* recipe : {"tensorwise", "rowwise"})
    expectAllOk(runWorkers("tp_fp8_deferred", {.ranks = 2, .arg = recipe}));
}
TEST(TpFp8Codes, TheStepsWeightCacheChangesNothing) {
  for (const char* recipe : {"tensorwise", "rowwise"}) expectAllOk(runWorkers("tp_fp8_cache", {.ranks = 2, .arg = recipe}));
}
#endif
