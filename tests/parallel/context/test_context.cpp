// Context parallelism (src/parallel/context): the chunk assignment as a table, the reordering of
// gathered shards, the errors; and the attention over a split sequence against causal attention
// over the whole sequence in one process (Gloo, cp 2 and 4, grouped-query and multi-head, chunks
// of an odd length): every rank's output and its shares of the q, k and v gradients, rtol 1e-5;
// the math kernel asked for by name is the CPU's default, the fused ones are refused by name.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "tessera/common/attention.h"
#include "tessera/common/error.h"
#include "harness/multiprocess.h"
#include "tessera/parallel/context/attention.h"
#include "tessera/parallel/context/chunks.h"
#include "reference.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
std::vector<int64_t> list(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}
}  // namespace

TEST(ContextChunks, AssignmentTable) {
  using V = std::vector<int64_t>;
  // cp 1: the whole sequence, as two chunks.
  EXPECT_EQ(list(cp::positionsOf(4, 1, 0)), (V{0, 1, 2, 3}));
  // cp 2, T 8: chunks of 2; rank 0 chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(list(cp::positionsOf(8, 2, 0)), (V{0, 1, 6, 7}));
  EXPECT_EQ(list(cp::positionsOf(8, 2, 1)), (V{2, 3, 4, 5}));
  // cp 4, T 8: chunks of 1.
  const std::vector<V> cp4 = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(list(cp::positionsOf(8, 4, r)), cp4[r]) << "rank " << r;
  EXPECT_EQ(cp::chunksOf(4, 1), (V{1, 6}));
  // Every rank's causal work (keys seen, summed over its queries) is the same.
  for (int n : {2, 4, 8}) {
    const int64_t T = 4 * n;
    std::vector<int64_t> work;
    for (int r = 0; r < n; ++r) work.push_back(cp::positionsOf(T, n, r).add(1).sum().item<int64_t>());
    EXPECT_EQ(std::count(work.begin(), work.end(), work[0]), n) << "cp " << n << ": " << fmt::format("{}", fmt::join(work, ","));
  }
}

TEST(ContextChunks, ShardsGatheredInRankOrderReorderToTheSequence) {
  for (int n : {1, 2, 3, 4}) {
    const int64_t T = 6 * n;
    auto x = at::arange(T, at::kLong).view({T, 1}).expand({T, 2}).contiguous();
    std::vector<at::Tensor> shards;
    for (int r = 0; r < n; ++r) {
      auto s = cp::shard(x, 0, n, r);
      EXPECT_TRUE(at::equal(s.select(1, 0), cp::positionsOf(T, n, r))) << "cp " << n << " rank " << r;
      shards.push_back(s);
    }
    auto gathered = at::cat(shards, 0);
    EXPECT_TRUE(at::equal(gathered.index_select(0, cp::gatheredToGlobal(T, n)), x)) << "cp " << n;
  }
}

TEST(ContextChunks, LengthsThatDoNotSplitAreClearErrors) {
  try {
    cp::positionsOf(12, 4, 0);
    FAIL() << "T 12 with cp 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence length 12 is not divisible by 2 x cp = 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(cp::chunksOf(2, 2), Error);
  EXPECT_THROW(cp::shard(at::zeros({6}), 1, 1, 0), Error);
}

// arg: "<Hq>/<Hkv>" heads; the chunk length is 3 (odd) and 1 for cp 4.
TESSERA_WORKER(cp_attention) {
  const auto slash = w.arg.find('/');
  const int64_t hq = std::stoll(w.arg.substr(0, slash)), hkv = std::stoll(w.arg.substr(slash + 1));
  auto ctx = initWorker(w);
  const auto& g = ctx.world;
  const int n = g->size(), r = g->rank();
  for (int64_t c : {int64_t{3}, int64_t{1}}) {
    const int64_t T = 2 * n * c, B = 2, D = 4;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(17 + c);
    auto q = at::randn({T, B, hq, D}, gen).requires_grad_(true);
    auto k = at::randn({T, B, hkv, D}, gen).requires_grad_(true);
    auto v = at::randn({T, B, hkv, D}, gen).requires_grad_(true);
    auto gy = at::randn({T, B, hq, D}, gen);
    // The whole sequence in this process: causal attention with each kv head repeated.
    auto ref = causalReference(q, k, v);
    (ref * gy).sum().backward();
    // This rank's share through the context-parallel op.
    auto mine = [&](const at::Tensor& x) { return cp::shard(x.detach(), 0, n, r); };
    auto ql = mine(q).requires_grad_(true), kl = mine(k).requires_grad_(true), vl = mine(v).requires_grad_(true);
    auto out = cp::attention(ql, kl, vl, g);
    (out * mine(gy)).sum().backward();
    const std::string where = fmt::format("cp {} rank {} heads {}/{} chunk {}", n, r, hq, hkv, c);
    auto near = [&](const at::Tensor& got, const at::Tensor& want, const char* what) {
      WCHECK(got.sizes() == want.sizes() && at::allclose(got, want, 1e-5, 1e-6), "{}: {} max |diff| {}", where, what,
             got.sizes() == want.sizes() ? (got - want).abs().max().item<double>() : -1.0);
    };
    near(out.detach(), mine(ref), "output");
    near(ql.grad(), mine(q.grad()), "q gradient");
    near(kl.grad(), mine(k.grad()), "k gradient");
    near(vl.grad(), mine(v.grad()), "v gradient");
    // The CPU's kernel is the math path; the fused kernels are refused by name.
    auto ql2 = ql.detach(), kl2 = kl.detach(), vl2 = vl.detach();
    WCHECK(at::equal(cp::attention(ql2, kl2, vl2, g, cp::Kernel::Math), out.detach()), "{}: math is not auto", where);
    for (auto kernel : {cp::Kernel::Flash, cp::Kernel::Efficient})
      expectErrorContaining([&] { cp::attention(ql2, kl2, vl2, g, kernel); },
                            {"rank", "kernel", cp::kernelName(kernel)});
  }
}

class ContextAttention : public ::testing::TestWithParam<std::string> {};
TEST_P(ContextAttention, MatchesWholeSequenceAttention) {
  for (int ranks : {1, 2, 4}) expectAllOk(runWorkers("cp_attention", {.ranks = ranks, .arg = GetParam()}));
}
INSTANTIATE_TEST_SUITE_P(Heads, ContextAttention, ::testing::Values("4/4", "4/2", "4/1"));
