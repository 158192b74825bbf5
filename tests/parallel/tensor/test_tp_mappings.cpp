// Every op of mappings.h, one at a time, forward AND backward, against its reference formula
// (TP = 2 and 4, Gloo). Each rank r feeds its own input x_r and upstream gradient g_r (seeded
// by r, so every rank can compute every other rank's tensors and so the formulas):
//   copyToRegion      fwd x_r                          bwd Σ_q g_q
//   reduceFromRegion  fwd Σ_q x_q                      bwd g_r
//   gatherLastDim     fwd cat_q x_q (last dim)         bwd chunk r of g_r (last dim)
//   splitLastDim      fwd chunk r of x_r (last dim)    bwd cat_q g_q (last dim)
//   gatherSeq         fwd cat_q x_q (dim 0)            bwd chunk r of Σ_q g_q (dim 0)
//   reduceScatterSeq  fwd chunk r of Σ_q x_q (dim 0)   bwd cat_q g_q (dim 0)
//   scatterSeq        fwd chunk r of x_r (dim 0)       bwd cat_q g_q (dim 0)
// Rank-dependent tensors make a wrong rank's block, a missing sum or a sum where none belongs
// visible. The inputs are non-contiguous views (the ops must not assume a layout). Values are
// small integers, so every sum is exact in float32: results must be bitwise equal.
// Then the divisibility and 0-D errors: named by op and numbers, on every rank, before any
// communication (a rank that communicated would leave the others hanging: the run's timeout).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fmt/ranges.h>

#include <functional>

#include "harness/multiprocess.h"
#include "tessera/parallel/tensor/mappings.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Rank q's tensor for `seed`: integers in [-8, 8] as float32, the same on every rank that asks.
at::Tensor ofRank(std::vector<int64_t> shape, int seed, int q) {
  auto gen = at::detail::createCPUGenerator(1000 * seed + q);
  return at::randint(-8, 9, shape, gen).to(at::kFloat);
}
// The same values in a non-contiguous layout (dims 0 and 1 swapped in memory).
at::Tensor strided(const at::Tensor& t) { return t.transpose(0, 1).contiguous().transpose(0, 1); }

std::vector<at::Tensor> allRanks(std::vector<int64_t> shape, int seed, int n) {
  std::vector<at::Tensor> v;
  for (int q = 0; q < n; ++q) v.push_back(ofRank(shape, seed, q));
  return v;
}
at::Tensor sum(const std::vector<at::Tensor>& v) { return at::stack(v).sum(0); }

void expectEqual(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined(), "{}: undefined", what);
  WCHECK(got.sizes() == want.sizes(), "{}: shape [{}], expected [{}]", what, fmt::join(got.sizes(), ", "),
         fmt::join(want.sizes(), ", "));
  WCHECK(got.equal(want), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}

using Op = std::function<at::Tensor(const at::Tensor&, const CommPtr&)>;

// Runs `op` on this rank's input (shape inShape, seed 1) with upstream gradient (outShape,
// seed 2) and compares y and x.grad with the formulas given all ranks' inputs and gradients.
void check(const char* name, const Op& op, std::vector<int64_t> inShape, std::vector<int64_t> outShape,
           const CommPtr& tp,
           const std::function<at::Tensor(const std::vector<at::Tensor>& xs)>& fwd,
           const std::function<at::Tensor(const std::vector<at::Tensor>& gs)>& bwd) {
  const int n = tp->size(), r = tp->rank();
  auto xs = allRanks(inShape, 1, n), gs = allRanks(outShape, 2, n);
  auto x = strided(xs[r]).requires_grad_();
  auto y = op(x, tp);
  expectEqual(y.detach(), fwd(xs), fmt::format("{} forward (rank {})", name, r));
  y.backward(gs[r]);
  expectEqual(x.grad(), bwd(gs), fmt::format("{} backward (rank {})", name, r));
}

}  // namespace

TESSERA_WORKER(tp_mappings) {
  auto ctx = initWorker(w);
  const auto& tp = ctx.world;
  const int64_t n = tp->size(), r = tp->rank();
  const int64_t m = 3, b = 2, k = 5;  // rows per rank, a middle dim, features per rank
  auto chunk = [&](const at::Tensor& t, int64_t dim) { return t.chunk(n, dim)[r]; };
  auto cat = [](const std::vector<at::Tensor>& v, int64_t dim) { return at::cat(v, dim); };

  check("copy_to_region", tp::copyToRegion, {m, b, k}, {m, b, k}, tp,  //
        [&](auto& xs) { return xs[r]; }, [&](auto& gs) { return sum(gs); });
  check("reduce_from_region", tp::reduceFromRegion, {m, b, k}, {m, b, k}, tp,  //
        [&](auto& xs) { return sum(xs); }, [&](auto& gs) { return gs[r]; });
  check("gather_last_dim", tp::gatherLastDim, {m, b, k}, {m, b, n * k}, tp,  //
        [&](auto& xs) { return cat(xs, -1); }, [&](auto& gs) { return chunk(gs[r], -1); });
  check("split_last_dim", tp::splitLastDim, {m, b, n * k}, {m, b, k}, tp,  //
        [&](auto& xs) { return chunk(xs[r], -1); }, [&](auto& gs) { return cat(gs, -1); });
  check("gather_seq", tp::gatherSeq, {m, b, k}, {n * m, b, k}, tp,  //
        [&](auto& xs) { return cat(xs, 0); }, [&](auto& gs) { return chunk(sum(gs), 0); });
  check("reduce_scatter_seq", tp::reduceScatterSeq, {n * m, b, k}, {m, b, k}, tp,  //
        [&](auto& xs) { return chunk(sum(xs), 0); }, [&](auto& gs) { return cat(gs, 0); });
  check("scatter_seq", tp::scatterSeq, {n * m, b, k}, {m, b, k}, tp,  //
        [&](auto& xs) { return chunk(xs[r], 0); }, [&](auto& gs) { return cat(gs, 0); });

  // Errors: a split dimension that does not divide (n·m + 1 rows, n·k + 1 features), and 0-D
  // tensors, which have no dimension to gather or split.
  const auto size = fmt::format("tensor-parallel size {}", n);
  const auto rows = fmt::format("size {}", n * m + 1);
  expectErrorContaining([&] { tp::splitLastDim(at::ones({m, n * k + 1}), tp); },
                        {"split_last_dim", fmt::format("size {}", n * k + 1).c_str(), size.c_str()});
  expectErrorContaining([&] { tp::reduceScatterSeq(at::ones({n * m + 1, k}), tp); },
                        {"reduce_scatter_seq", "dimension 0", rows.c_str(), size.c_str()});
  expectErrorContaining([&] { tp::scatterSeq(at::ones({n * m + 1, k}), tp); },
                        {"scatter_seq", "dimension 0", rows.c_str(), size.c_str()});
  auto scalar = at::scalar_tensor(1.0);
  expectErrorContaining([&] { tp::gatherSeq(scalar, tp); }, {"gather_seq", "0-D"});
  expectErrorContaining([&] { tp::gatherLastDim(scalar, tp); }, {"gather_last_dim", "0-D"});
  expectErrorContaining([&] { tp::splitLastDim(scalar, tp); }, {"split_last_dim", "[]"});
  // The group still works after the rejected calls: every rank is at the same point.
  expectEqual(tp::reduceFromRegion(at::ones({2}), tp), at::full({2}, static_cast<float>(n)), "after the errors");
}

class TpMappings : public ::testing::TestWithParam<int> {};

TEST_P(TpMappings, ForwardAndBackwardMatchTheirFormulas) {
  expectAllOk(runWorkers("tp_mappings", {.ranks = GetParam(), .timeout = std::chrono::seconds(120)}));
}

INSTANTIATE_TEST_SUITE_P(TP, TpMappings, ::testing::Values(2, 4));
