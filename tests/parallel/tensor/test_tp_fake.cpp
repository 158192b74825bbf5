// The fake communicator (src/comm/fake) and, over it, the tensor-parallel linear ops on one device.
// With a fake group of 2 "every rank is this one": a column-parallel layer's all-reduce of the
// input gradient leaves this rank's part, a row-parallel layer's sum leaves this rank's partial
// product, sequence-parallel gathers repeat this rank's tokens and reduce-scatters keep its slot.
// So each op must equal at::linear on this rank's shard, arranged as those rules say, in output,
// input gradient and weight/bias gradients: a single-process reference for the ops' own
// arithmetic (their casts, saved tensors and weight-gradient GEMMs).
// Each case runs two micro-batches (gradients accumulate), also with accumulateGradInGemm (the
// GEMM sums the weight and bias gradients straight into .grad).
// The CPU suite runs in float32 (rtol 1e-5: only the order of sums differs). The GPU suite
// (TESSERA_TP_FAKE_GPU_SUITE, one GPU) runs under bf16 autocast, where the ops' weight gradients
// come out of a float32 GEMM sum and the reference's are bf16 products cast up: compared against a
// float64 product of the same bf16 inputs, ours must be at least as close as the reference's
// (and both within 1e-2 of the largest magnitude).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <functional>
#include <string>

#include "comm/fake/fake_communicator.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/parallel/tensor/linear.h"
#ifdef TESSERA_TP_FAKE_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif

using namespace tessera;

namespace {

#ifdef TESSERA_TP_FAKE_GPU_SUITE
const at::Device kDev(at::kCUDA, 0);
constexpr bool kBf16 = true;
#else
const at::Device kDev(at::kCPU);
constexpr bool kBf16 = false;
#endif

double maxRel(const at::Tensor& got, const at::Tensor& want) {
  auto g = got.to(at::kDouble).cpu(), w = want.to(at::kDouble).cpu();
  return ((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item<double>();
}

void expectNear(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_LT(maxRel(got, want), kBf16 ? 2e-2 : 1e-5) << what;
}

// The weight gradient: ours against the float64 product of the bf16-rounded inputs (exact up to
// the float32 sum), and no worse than autograd's reference.
void expectWeightGrad(const at::Tensor& ours, const at::Tensor& ref, const at::Tensor& exact, const std::string& what) {
  ASSERT_EQ(ours.scalar_type(), at::kFloat) << what;
  expectNear(ours, ref, what + " vs at::linear");
  if (kBf16) EXPECT_LE(maxRel(ours, exact), maxRel(ref, exact) + 1e-6) << what << ": less exact than at::linear";
}

// The values a GEMM input holds (bf16-rounded under autocast), as float64 on the CPU.
at::Tensor rounded(const at::Tensor& t) {
  return (kBf16 ? t.to(at::kBFloat16).to(at::kDouble) : t.to(at::kDouble)).cpu();
}

struct Case {
  bool row, sp;
  bool accumulate = false;  // ParallelLinearOptions::accumulateGradInGemm
};

// Two micro-batches of y = layer(x), loss = <y, probe>, against the reference built from
// at::linear on the same shard (its leaves accumulate .grad over both, as ours must).
void runCase(Case c) {
  const int64_t in = 64, out = 96, s = 16, b = 2;
  auto fake = makeFakeCommunicator(0, 2, kDev, "tp");
  torch::manual_seed(3);
  tp::ParallelLinearOptions o;
  o.name = c.row ? "row" : "column";
  o.sequenceParallel = c.sp;
  o.accumulateGradInGemm = c.accumulate;
  o.overlap.forwardChunks = 1;
  o.overlap.smCarveout = 0;
  at::Tensor w, bias;
  std::function<at::Tensor(const at::Tensor&)> layer;
  if (c.row) {
    tp::RowParallelLinear l(fake, in, out, o);
    l->to(kDev);
    w = l->weight, bias = l->bias;
    layer = [l](const at::Tensor& v) mutable { return l->forward(v); };
  } else {
    tp::ColumnParallelLinear l(fake, in, out, o);
    l->to(kDev);
    w = l->weight, bias = l->bias;
    layer = [l](const at::Tensor& v) mutable { return l->forward(v); };
  }
  const int64_t inLocal = w.size(1), outLocal = c.row ? out : out / 2;
  auto wRef = w.detach().clone().requires_grad_(true), bRef = bias.detach().clone().requires_grad_(true);
  const std::string name = std::string(c.row ? "row" : "column") + (c.sp ? "+sp" : "") + (c.accumulate ? "+acc" : "");
  at::Tensor exact = at::zeros({outLocal, inLocal}, at::kDouble);
  for (int m = 0; m < 2; ++m) {
    const std::string mb = name + ", micro-batch " + std::to_string(m);
    // Row with sequence parallel: full tokens in, this rank's half out. Column with sequence
    // parallel: this rank's tokens in, the (repeated) full sequence out.
    const int64_t sIn = c.sp && !c.row ? s / 2 : s;
    auto x = at::randn({sIn, b, inLocal}, kDev).requires_grad_(true);
    auto xRef = x.detach().clone().requires_grad_(true);
    at::Tensor y, yRef;
    {
      Bf16Autocast ac(kBf16);
      y = layer(x);
      yRef = c.sp && !c.row ? at::linear(at::cat({xRef, xRef.detach()}), wRef, bRef)  // 2nd copy: another rank's
                            : at::linear(xRef, wRef, bRef);
    }
    auto probe = at::randn(y.sizes(), kDev);
    at::Tensor lossRef;
    if (c.sp && c.row) {
      // Forward keeps this rank's half of the tokens; backward gathers the gradient: [probe; probe].
      expectNear(y, yRef.narrow(0, 0, s / 2), mb + ": forward");
      lossRef = ((yRef.narrow(0, 0, s / 2) + yRef.narrow(0, s / 2, s / 2)).to(at::kFloat) * probe).sum();
    } else {
      expectNear(y, yRef, mb + ": forward");
      lossRef = (yRef.to(at::kFloat) * probe).sum();
    }
    (y.to(at::kFloat) * probe).sum().backward();
    lossRef.backward();
    expectNear(x.grad(), xRef.grad(), mb + ": input gradient");
    // The exact weight gradient from the GEMM's inputs as the op sees them.
    at::Tensor gyExact = (c.sp && c.row) ? at::cat({probe, probe}) : probe;
    at::Tensor xExact = (c.sp && !c.row) ? at::cat({x.detach(), x.detach()}) : x.detach();
    exact += rounded(gyExact.reshape({-1, outLocal})).t().mm(rounded(xExact.reshape({-1, inLocal})));
  }
  expectNear(bias.grad(), bRef.grad(), name + ": bias gradient over 2 micro-batches");
  expectWeightGrad(w.grad(), wRef.grad(), exact, name + ": weight gradient over 2 micro-batches");
}

}  // namespace

#ifdef TESSERA_TP_FAKE_GPU_SUITE
#define REQUIRE_DEVICE() TESSERA_REQUIRE_CUDA_LIBTORCH()
#else
#define REQUIRE_DEVICE() (void)0
#endif

TEST(TpOnFakeGroup, Column) { REQUIRE_DEVICE(); runCase({false, false}); }
TEST(TpOnFakeGroup, Row) { REQUIRE_DEVICE(); runCase({true, false}); }
TEST(TpOnFakeGroup, ColumnSequenceParallel) { REQUIRE_DEVICE(); runCase({false, true}); }
TEST(TpOnFakeGroup, RowSequenceParallel) { REQUIRE_DEVICE(); runCase({true, true}); }
// Weight and bias gradients summed into .grad by the GEMM (accumulateGradInGemm) at tp = 2.
TEST(TpOnFakeGroup, ColumnAccumulating) { REQUIRE_DEVICE(); runCase({false, false, true}); }
TEST(TpOnFakeGroup, RowAccumulating) { REQUIRE_DEVICE(); runCase({true, false, true}); }
TEST(TpOnFakeGroup, ColumnSequenceParallelAccumulating) { REQUIRE_DEVICE(); runCase({false, true, true}); }
TEST(TpOnFakeGroup, RowSequenceParallelAccumulating) { REQUIRE_DEVICE(); runCase({true, true, true}); }

#ifndef TESSERA_TP_FAKE_GPU_SUITE
TEST(TpOnFakeGroup, AccumulatingRefusesABadGrad) {
  auto fake = makeFakeCommunicator(0, 2, at::kCPU, "tp");
  tp::ParallelLinearOptions o;
  o.name = "blocks.0.fc1";
  o.accumulateGradInGemm = true;
  tp::ColumnParallelLinear l(fake, 8, 6, o);
  l->weight.mutable_grad() = at::zeros({3, 8}, at::kDouble);
  try {
    l->forward(at::randn({4, 8}));
    ADD_FAILURE() << "a float64 .grad accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blocks.0.fc1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float64"), std::string::npos) << msg;
  }
}
#endif

#ifndef TESSERA_TP_FAKE_GPU_SUITE
TEST(FakeCommunicator, EveryRankIsThisOne) {
  auto c = makeFakeCommunicator(1, 3, at::kCPU, "f");
  EXPECT_EQ(c->rank(), 1);
  EXPECT_EQ(c->size(), 3);
  auto small = at::arange(4, at::kFloat);
  auto w = c->allReduce(small);
  EXPECT_TRUE(w->completed());
  EXPECT_TRUE(at::equal(small, at::arange(4, at::kFloat))) << "a sum is this rank's part";
  auto gathered = at::zeros({6});
  c->allGather(gathered, at::tensor({7.f, 8.f}))->wait();
  EXPECT_TRUE(at::equal(gathered, at::tensor({7.f, 8.f, 7.f, 8.f, 7.f, 8.f})));
  auto slot = at::zeros({2});
  c->reduceScatter(slot, at::arange(6, at::kFloat))->synchronize();
  EXPECT_TRUE(at::equal(slot, at::tensor({2.f, 3.f}))) << "rank 1's slot";
  auto child = c->split(0, c->rank(), "child");
  ASSERT_TRUE(child);
  EXPECT_EQ(child->size(), 3);
  EXPECT_EQ(child->rank(), 1);
  EXPECT_EQ(c->split(-1, 0, "none"), nullptr);
  try {
    c->allReduce(at::ones({2}, at::kDouble));
    ADD_FAILURE() << "float64 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
  try {
    makeFakeCommunicator(3, 3, at::kCPU);
    ADD_FAILURE() << "rank 3 of 3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 of 3"), std::string::npos) << e.what();
  }
}
#endif
