// FP8 in the tensor-parallel linears (ParallelLinearOptions::fp8, the CPU emulation): a column
// layer then a row layer (the Megatron MLP pair) over tp = 2 and 4, plain and sequence parallel,
// for both recipes, against the recipe's maths written out here on the unsharded tensors with
// fp8::fakeQuantize (which test_fp8 checks bit for bit against the formats): outputs, the input
// gradient and every weight and bias gradient shard. The sharded layers must scale as the
// unsharded tensors do (their amaxes all-reduced over tp), or the codes, and so these values,
// differ. The output must also differ from the float32 layers' (FP8 was applied).
// Tolerance: float32 sums in another order (the row layer's partial sums), rtol 1e-5, atol 1e-6.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tessera/fp8/fake_quant.h"
#include "harness/multiprocess.h"
#include "tessera/parallel/tensor/linear.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t IN = 8, H = 16, OUT = 12, S = 8, B = 3;

at::Tensor seededFp8(std::vector<int64_t> shape, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g);
}

void expectNear(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: missing or shape differs", what);
  WCHECK(at::allclose(got, want, 1e-5, 1e-6), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}

using fp8::Axis;
using fp8::Format;
at::Tensor fq(const at::Tensor& t, Format f, Axis a) { return fp8::fakeQuantize(t, f, a); }
}  // namespace

// arg: "tensorwise" | "rowwise", "_sp" for sequence parallel.
TESSERA_WORKER(tp_fp8) {
  std::string mode = w.arg;
  const bool sp = mode.size() > 3 && mode.substr(mode.size() - 3) == "_sp";
  if (sp) mode = mode.substr(0, mode.size() - 3);
  const auto recipe = fp8::parseRecipe(mode);
  const bool tensorwise = recipe == fp8::Recipe::Tensorwise;
  auto ctx = initWorker(w);
  const auto& tp = ctx.world;
  const int64_t p = tp->size(), r = tp->rank();

  torch::manual_seed(7);
  torch::nn::Linear full1(IN, H), full2(H, OUT);
  tp::ParallelLinearOptions co, ro;
  co.name = "fc1", ro.name = "fc2";
  co.sequenceParallel = ro.sequenceParallel = sp;
  co.fp8 = ro.fp8 = recipe;
  co.initFromRng = ro.initFromRng = false;
  tp::ColumnParallelLinear col(tp, IN, H, co);
  tp::RowParallelLinear row(tp, H, OUT, ro);
  col->loadFull(full1->weight, full1->bias);
  row->loadFull(full2->weight, full2->bias);

  const auto x = seededFp8({S, B, IN}, 11), gy = seededFp8({S, B, OUT}, 12);
  auto mine = [&](const at::Tensor& t) { return sp ? t.chunk(p, 0)[r].contiguous() : t; };
  auto xin = mine(x).clone().requires_grad_(true);
  auto y = row(col(xin));
  (y * mine(gy)).sum().backward();

  // The recipe on the unsharded tensors.
  const auto E4 = Format::E4M3, E5 = Format::E5M2;
  const auto fwd = tensorwise ? Axis::Tensor : Axis::Rows;
  auto x2 = x.reshape({-1, IN}), gy2 = gy.reshape({-1, OUT});
  auto W1 = full1->weight.detach(), b1 = full1->bias.detach(), W2 = full2->weight.detach(), b2 = full2->bias.detach();
  auto xq = fq(x2, E4, fwd), w1q = fq(W1, E4, fwd);
  auto h = at::addmm(b1, xq, w1q.t());
  auto hq = fq(h, E4, fwd), w2q = fq(W2, E4, fwd);
  auto yRef = at::addmm(b2, hq, w2q.t());
  auto gyq = fq(gy2, E5, fwd);
  auto gh = gyq.mm(tensorwise ? w2q : fq(W2, E4, Axis::Cols));
  auto gW2 = tensorwise ? gyq.t().mm(hq) : gy2.t().mm(h);
  auto ghq = fq(gh, E5, fwd);
  auto gx = ghq.mm(tensorwise ? w1q : fq(W1, E4, Axis::Cols));
  auto gW1 = tensorwise ? ghq.t().mm(xq) : gh.t().mm(x2);

  const std::string where = fmt::format("{}{} tp {} rank {}", mode, sp ? " sp" : "", p, r);
  expectNear(y.detach(), mine(yRef.view({S, B, OUT})), where + " output");
  expectNear(xin.grad(), mine(gx.view({S, B, IN})), where + " input gradient");
  expectNear(col->weight.grad(), gW1.chunk(p, 0)[r], where + " fc1 weight gradient");
  expectNear(col->bias.grad(), gh.sum(0).chunk(p, 0)[r], where + " fc1 bias gradient");
  expectNear(row->weight.grad(), gW2.chunk(p, 1)[r], where + " fc2 weight gradient");
  expectNear(row->bias.grad(), gy2.sum(0), where + " fc2 bias gradient");
  // FP8 was applied: the float32 layers give something else.
  auto plain = at::addmm(b2, at::addmm(b1, x2, W1.t()), W2.t());
  WCHECK((mine(plain.view({S, B, OUT})) - y.detach()).abs().max().item<double>() > 1e-4,
         "{}: the output equals the float32 layers'", where);
}

class TpFp8 : public ::testing::TestWithParam<std::string> {};
TEST_P(TpFp8, MatchesTheRecipeOnUnshardedTensors) {
  for (int ranks : {2, 4}) expectAllOk(runWorkers("tp_fp8", {.ranks = ranks, .arg = GetParam()}));
}
INSTANTIATE_TEST_SUITE_P(Recipes, TpFp8, ::testing::Values("tensorwise", "tensorwise_sp", "rowwise", "rowwise_sp"));
