// Tensor-parallel linear layers against the unsharded torch::nn::Linear (TP = 2 and 4, Gloo):
// outputs, input gradients and weight/bias gradients (this rank's shard of the full
// gradient), for column, row, the Megatron MLP pair, and the pair in sequence-parallel mode.
// Tolerance: fp32; the only difference is the summation order of the row-parallel inner
// products (tp partial sums), a few ulps on values of order 1: rtol 1e-5, atol 1e-6.
// A mode "<case>_chunks<N>" runs the same case with the forward in N pieces (row layers reduce
// piece by piece; with sequence parallel the column layer gathers and the row layer's backward
// gathers piece by piece): the results must not change. A mode "<case>_ring" reduces the row
// layers' forward by the ring of point-to-point transfers (row_linear.h) instead.
#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "harness/multiprocess.h"
#ifdef TESSERA_TP_LINEAR_GPU_SUITE
#include "comm/gpu/gpu_test_util.h"
#endif
#include "tessera/parallel/tensor/linear.h"
#include "tessera/parallel/tensor/mappings.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t IN = 8, H = 16, OUT = 12, S = 8, B = 3;

void expectClose(const at::Tensor& gotAnywhere, const at::Tensor& want, const std::string& what) {
  auto got = gotAnywhere.cpu();
  WCHECK(got.sizes() == want.sizes(), "{}: shape [{}] vs [{}]", what, fmt::join(got.sizes(), ","),
         fmt::join(want.sizes(), ","));
  double d = (got - want).abs().max().item<double>();
  WCHECK(at::allclose(got, want, 1e-5, 1e-6), "{}: max |diff| = {}", what, d);
}
at::Tensor shard(const at::Tensor& t, int64_t dim, const CommPtr& tp) { return t.chunk(tp->size(), dim)[tp->rank()]; }

// Same input and upstream gradient on every rank.
at::Tensor seeded(std::vector<int64_t> shape, int seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g);
}
}  // namespace

// arg: [cuda:]<mode>[_chunks<N>|_ring][:carve<N>] — cuda: NCCL and CUDA tensors (the GPU suite).
TESSERA_WORKER(tp_linear) {
  std::string mode = w.arg;
  const bool cuda = mode.rfind("cuda:", 0) == 0;
  if (cuda) mode = mode.substr(5);
  tp::LinearOverlap overlap;
  overlap.forwardChunks = 1;
  overlap.smCarveout = 0;
  overlap.ring = false;
  if (auto pos = mode.find(":carve"); pos != std::string::npos) {
    overlap.smCarveout = std::stoi(mode.substr(pos + 6));
    mode = mode.substr(0, pos);
  }
  if (auto pos = mode.find("_ring"); pos != std::string::npos) {
    overlap.ring = true;
    mode = mode.substr(0, pos);
  }
  if (auto pos = mode.find("_chunks"); pos != std::string::npos) {
    overlap.forwardChunks = std::stoi(mode.substr(pos + 7));
    mode = mode.substr(0, pos);
  }
  auto ctx = initWorker(w, cuda ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const at::Device dev = ctx.device;

  torch::manual_seed(7);
  torch::nn::Linear ref1(IN, H), ref2(H, OUT);
  torch::manual_seed(7);
  tp::ParallelLinearOptions co, ro;
  co.name = "fc1";
  ro.name = "fc2";
  co.overlap = ro.overlap = overlap;
  co.gatherOutput = mode == "column_gather";
  co.sequenceParallel = ro.sequenceParallel = mode == "mlp_seq";
  tp::ColumnParallelLinear col(tp, IN, H, co);
  tp::RowParallelLinear row(tp, H, OUT, ro);
  // Exactly the unsharded initial weights.
  WCHECK(col->weight.equal(shard(ref1->weight, 0, tp)) && col->bias.equal(shard(ref1->bias, 0, tp)),
         "column init is not the shard of the unsharded init");
  WCHECK(row->weight.equal(shard(ref2->weight, 1, tp)) && row->bias.equal(ref2->bias),
         "row init is not the shard of the unsharded init");
  col->to(dev);
  row->to(dev);

  auto xFull = seeded({S, B, IN}, 11);
  auto xRef = xFull.clone().requires_grad_();
  const bool seq = mode == "mlp_seq";
  auto x = (seq ? shard(xFull, 0, tp) : xFull).clone().to(dev).requires_grad_();

  at::Tensor y, yRef;
  if (mode == "column" || mode == "column_gather") {
    y = col->forward(x);
    yRef = ref1->forward(xRef);
    auto want = mode == "column" ? shard(yRef, -1, tp) : yRef;
    expectClose(y, want.detach(), mode + " output");
    auto g = seeded(yRef.sizes().vec(), 12);
    (y * (mode == "column" ? shard(g, -1, tp) : g).to(dev)).sum().backward();
    (yRef * g).sum().backward();
  } else if (mode == "row") {
    tp::ParallelLinearOptions o;
    o.inputIsParallel = false;
    o.name = "fc2";
    o.overlap = overlap;
    torch::manual_seed(7);
    torch::nn::Linear r(H, OUT);
    torch::manual_seed(7);
    tp::RowParallelLinear rp(tp, H, OUT, o);
    rp->to(dev);
    auto xh = seeded({S, B, H}, 13);
    auto a = xh.clone().to(dev).requires_grad_(), aRef = xh.clone().requires_grad_();
    auto out = rp->forward(a), outRef = r->forward(aRef);
    expectClose(out, outRef.detach(), "row output");
    auto g = seeded(outRef.sizes().vec(), 14);
    (out * g.to(dev)).sum().backward();
    (outRef * g).sum().backward();
    expectClose(a.grad(), aRef.grad(), "row input grad");
    expectClose(rp->weight.grad(), shard(r->weight.grad(), 1, tp), "row weight grad");
    expectClose(rp->bias.grad(), r->bias.grad(), "row bias grad");
    return;
  } else {  // mlp, mlp_seq: column -> gelu -> row (input is parallel)
    y = row->forward(at::gelu(col->forward(x)));
    yRef = ref2->forward(at::gelu(ref1->forward(xRef)));
    expectClose(y, (seq ? shard(yRef, 0, tp) : yRef).detach(), mode + " output");
    auto g = seeded(yRef.sizes().vec(), 15);
    (y * (seq ? shard(g, 0, tp) : g).to(dev)).sum().backward();
    (yRef * g).sum().backward();
    expectClose(row->weight.grad(), shard(ref2->weight.grad(), 1, tp), mode + " fc2 weight grad");
    expectClose(row->bias.grad(), ref2->bias.grad(), mode + " fc2 bias grad");
  }
  expectClose(x.grad(), seq ? shard(xRef.grad(), 0, tp) : xRef.grad(), mode + " input grad");
  expectClose(col->weight.grad(), shard(ref1->weight.grad(), 0, tp), mode + " fc1 weight grad");
  expectClose(col->bias.grad(), shard(ref1->bias.grad(), 0, tp), mode + " fc1 bias grad");
}

struct TpCase {
  int ranks;
  const char* mode;
};
void PrintTo(const TpCase& c, std::ostream* os) { *os << "tp" << c.ranks << " " << c.mode; }

class TpLinear : public ::testing::TestWithParam<TpCase> {};

TEST_P(TpLinear, MatchesUnshardedLayers) {
  auto c = GetParam();
  expectAllOk(runWorkers("tp_linear", {.ranks = c.ranks, .arg = c.mode}));
}

#ifdef TESSERA_TP_LINEAR_GPU_SUITE
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TpLinear);
// The same checks on NCCL and CUDA tensors (fp32), with the forward in pieces and SMs carved out
// of the GEMMs that run beside a collective (the carveout is applied where LibTorch has it).
class TpLinearGpu : public ::testing::TestWithParam<const char*> {};
TEST_P(TpLinearGpu, MatchesUnshardedLayersOnNccl) {
  TESSERA_REQUIRE_GPUS(2);
  auto o = gpuRun(180);
  o.arg = std::string("cuda:") + GetParam();
  expectAllOk(runWorkers("tp_linear", o));
}
INSTANTIATE_TEST_SUITE_P(Cases, TpLinearGpu,
                         ::testing::Values("column", "row", "mlp", "mlp_seq", "row_chunks3:carve16", "mlp_chunks2:carve16",
                                           "mlp_seq_chunks2", "mlp_seq_chunks3:carve16", "row_ring",
                                           "mlp_ring:carve16", "mlp_seq_ring", "mlp_seq_ring:carve16"));
#else
INSTANTIATE_TEST_SUITE_P(Cases, TpLinear,
                         ::testing::Values(TpCase{2, "column"}, TpCase{4, "column"}, TpCase{2, "column_gather"},
                                           TpCase{4, "column_gather"},
                                           TpCase{2, "row"}, TpCase{4, "row"}, TpCase{2, "mlp"}, TpCase{4, "mlp"},
                                           TpCase{2, "mlp_seq"}, TpCase{4, "mlp_seq"}, TpCase{1, "mlp"},
                                           TpCase{2, "row_chunks3"}, TpCase{2, "mlp_chunks2"},
                                           TpCase{4, "mlp_seq_chunks2"}, TpCase{2, "mlp_seq_chunks3"},
                                           TpCase{2, "row_ring"}, TpCase{4, "row_ring"}, TpCase{2, "mlp_ring"},
                                           TpCase{2, "mlp_seq_ring"}, TpCase{4, "mlp_seq_ring"}));
#endif

TESSERA_WORKER(tp_bad_sizes) {
  auto ctx = initWorker(w);
  tp::ParallelLinearOptions o;
  o.name = "blocks.0.qkv";
  expectErrorContaining([&] { tp::ColumnParallelLinear c(ctx.world, 8, 6, o); },
                        {"'blocks.0.qkv'", "output features = 6", "tensor-parallel size 4"});
  expectErrorContaining([&] { tp::RowParallelLinear r(ctx.world, 10, 8, o); },
                        {"'blocks.0.qkv'", "input features = 10", "size 4"});
  expectErrorContaining([&] { tp::splitLastDim(at::ones({3, 5}), ctx.world); },
                        {"split_last_dim", "size 5", "tensor-parallel size 4"});
  tp::ColumnParallelLinear c(ctx.world, 8, 8, o);
  expectErrorContaining([&] { c->forward(at::ones({2, 7})); }, {"'blocks.0.qkv'", "input has 7 features, expects 8"});
  expectErrorContaining([&] { c->loadFull(at::ones({8, 9}), at::ones({8})); }, {"full weight has shape [8, 9]"});
  // A full input split by the row layer: a width that is not `in` (here not even divisible by tp)
  // names the layer, not the mapping it would reach.
  tp::ParallelLinearOptions full;
  full.name = "blocks.0.fc2";
  full.inputIsParallel = false;
  tp::RowParallelLinear rf(ctx.world, 8, 4, full);
  expectErrorContaining([&] { rf->forward(at::ones({2, 10})); },
                        {"'blocks.0.fc2'", "input not parallel", "input has 10 features", "in = 8", "size 4"});
  o.sequenceParallel = true;
  tp::RowParallelLinear rs(ctx.world, 8, 4, o);
  expectErrorContaining([&] { rs->forward(at::ones({6, 2, 2})); },
                        {"'blocks.0.qkv'", "sequence parallel", "6 tokens", "tensor-parallel size 4"});
  // Sequence parallel needs a token dimension besides the features: a 1-D input is named.
  expectErrorContaining([&] { rs->forward(at::ones({2})); },
                        {"'blocks.0.qkv'", "row-parallel, sequence parallel", "at least 2-D", "[2]"});
  tp::ColumnParallelLinear cs(ctx.world, 8, 8, o);
  expectErrorContaining([&] { cs->forward(at::ones({8})); },
                        {"'blocks.0.qkv'", "column-parallel, sequence parallel", "at least 2-D", "[8]"});
}

#ifndef TESSERA_TP_LINEAR_GPU_SUITE  // Gloo (CPU) ranks; the GPU image's LibTorch has no Gloo
TEST(TpLinear, SizesNotDivisibleAreClearErrors) { expectAllOk(runWorkers("tp_bad_sizes", {.ranks = 4})); }
#endif
