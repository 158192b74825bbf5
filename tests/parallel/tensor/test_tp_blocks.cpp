// A stack of two tensor-parallel GPT blocks against two unsharded blocks (tests/models'
// GptBlock, built from the same seed): outputs, input gradients and every parameter's
// gradient (this rank's shard of the full gradient), TP = 2 and 4, with and without sequence
// parallel. fp32; differences come only from the order of partial sums (row-parallel
// reductions): rtol 1e-5, atol 1e-5 on values of order 1.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "parallel/tensor/blocks.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t D = 32, HEADS = 4, S = 8, B = 2;

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: shape mismatch", what);
  WCHECK(at::allclose(got, want, 1e-5, 1e-5), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}
at::Tensor shard(const at::Tensor& t, int64_t dim, const CommPtr& tp) { return t.chunk(tp->size(), dim)[tp->rank()]; }
// The qkv rows of this rank's heads ([q | k | v] head-major → this rank's q, k, v rows).
at::Tensor qkvShard(const at::Tensor& full, const CommPtr& tp) {
  std::vector<at::Tensor> parts;
  for (auto& p : full.chunk(3, 0)) parts.push_back(shard(p, 0, tp));
  return at::cat(parts, 0);
}
}  // namespace

TESSERA_WORKER(tp_blocks) {
  auto ctx = initWorker(w);
  const auto& tp = ctx.world;
  const bool sp = w.arg == "sp";
  torch::manual_seed(5);
  GptBlock r0(D, HEADS), r1(D, HEADS);
  torch::manual_seed(5);
  tp::ParallelBlock p0(tp, D, HEADS, sp, "blocks.0"), p1(tp, D, HEADS, sp, "blocks.1");

  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto xFull = at::randn({B, S, D}, gen);  // reference layout [B, T, d]
  auto gFull = at::randn({B, S, D}, gen);
  auto xRef = xFull.clone().requires_grad_();
  auto yRef = r1->forward(r0->forward(xRef));
  (yRef * gFull).sum().backward();

  auto xT = xFull.transpose(0, 1).contiguous();  // [S, B, d]
  auto x = (sp ? shard(xT, 0, tp) : xT).clone().requires_grad_();
  auto y = p1->forward(p0->forward(x));
  auto gT = gFull.transpose(0, 1).contiguous();
  (y * (sp ? shard(gT, 0, tp) : gT)).sum().backward();

  auto yRefT = yRef.detach().transpose(0, 1).contiguous();
  expectClose(y, sp ? shard(yRefT, 0, tp) : yRefT, "output");
  auto gxRef = xRef.grad().transpose(0, 1).contiguous();
  expectClose(x.grad(), sp ? shard(gxRef, 0, tp) : gxRef, "input grad");
  std::pair<GptBlock*, tp::ParallelBlock*> pairs[] = {{&r0, &p0}, {&r1, &p1}};
  for (int k = 0; k < 2; ++k) {
    auto& r = *pairs[k].first;
    auto& p = *pairs[k].second;
    auto name = [&](const char* n) { return fmt::format("blocks.{}.{} grad", k, n); };
    expectClose(p->ln1->weight.grad(), r->ln1->weight.grad(), name("ln1.weight"));
    expectClose(p->ln1->bias.grad(), r->ln1->bias.grad(), name("ln1.bias"));
    expectClose(p->ln2->weight.grad(), r->ln2->weight.grad(), name("ln2.weight"));
    expectClose(p->ln2->bias.grad(), r->ln2->bias.grad(), name("ln2.bias"));
    expectClose(p->attn->qkv->weight.grad(), qkvShard(r->qkv->weight.grad(), tp), name("qkv.weight"));
    expectClose(p->attn->qkv->bias.grad(), qkvShard(r->qkv->bias.grad(), tp), name("qkv.bias"));
    expectClose(p->attn->proj->weight.grad(), shard(r->proj->weight.grad(), 1, tp), name("proj.weight"));
    expectClose(p->attn->proj->bias.grad(), r->proj->bias.grad(), name("proj.bias"));
    expectClose(p->mlp->fc1->weight.grad(), shard(r->fc1->weight.grad(), 0, tp), name("fc1.weight"));
    expectClose(p->mlp->fc1->bias.grad(), shard(r->fc1->bias.grad(), 0, tp), name("fc1.bias"));
    expectClose(p->mlp->fc2->weight.grad(), shard(r->fc2->weight.grad(), 1, tp), name("fc2.weight"));
    expectClose(p->mlp->fc2->bias.grad(), r->fc2->bias.grad(), name("fc2.bias"));
  }
}

struct BlockCase {
  int ranks;
  const char* mode;
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << "tp" << c.ranks << " " << c.mode; }

class TpBlocks : public ::testing::TestWithParam<BlockCase> {};

TEST_P(TpBlocks, StackMatchesUnshardedBlocks) {
  auto c = GetParam();
  expectAllOk(runWorkers("tp_blocks", {.ranks = c.ranks, .arg = c.mode}));
}

INSTANTIATE_TEST_SUITE_P(Cases, TpBlocks,
                         ::testing::Values(BlockCase{2, "plain"}, BlockCase{4, "plain"}, BlockCase{2, "sp"},
                                           BlockCase{4, "sp"}));

TESSERA_WORKER(tp_blocks_bad_heads) {
  auto ctx = initWorker(w);
  expectErrorContaining([&] { tp::ParallelBlock b(ctx.world, 30, 6, false, "blocks.3"); },
                        {"'blocks.3.attn'", "heads = 6", "tensor-parallel size 4"});
}

TEST(TpBlocks, HeadsNotDivisibleIsAClearError) { expectAllOk(runWorkers("tp_blocks_bad_heads", {.ranks = 4})); }

// An input that is not [tokens, batch, d] is an error naming the attention layer and the shape
// (not a torch view error), directly and through the block (whose LayerNorm takes any rank).
TESSERA_WORKER(tp_blocks_bad_input) {
  auto ctx = initWorker(w);
  for (bool sp : {false, true}) {
    tp::ParallelBlock b(ctx.world, D, HEADS, sp, "blocks.2");
    expectErrorContaining([&] { b->attn->forward(at::ones({S, D})); }, {"'blocks.2.attn'", "3-D", "[8, 32]"});
    expectErrorContaining([&] { b->forward(at::ones({S, B, 1, D})); }, {"'blocks.2.attn'", "3-D", "[8, 2, 1, 32]"});
  }
}

TEST(TpBlocks, InputNot3DIsAClearError) { expectAllOk(runWorkers("tp_blocks_bad_input", {.ranks = 2})); }
