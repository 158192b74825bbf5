// A stack of two tensor-parallel GPT blocks against two unsharded blocks (tests/models'
// GptBlock, built from the same seed): outputs, input gradients and every parameter's
// gradient (this rank's shard of the full gradient), TP = 2 and 4, with and without sequence
// parallel, and with hidden dropout (p = 0.25, training mode), whose masks must be the unsharded
// block's: then also a second forward (new masks, still the reference's), and eval mode (no
// dropout: the output of blocks without dropout, no mask drawn). fp32; differences come only from
// the order of partial sums (row-parallel reductions): rtol 1e-5, atol 1e-5 on values of order 1
// (dropout scales kept values by 1/(1 - p) = 4/3, exactly the same factor on both sides).
// The GPU suite (test_tp_blocks_gpu, TESSERA_TP_BLOCKS_GPU_SUITE) runs the same cases on CUDA over
// NCCL, one rank per visible GPU (up to 2; tp = 1 on one GPU still runs the blocks' CUDA paths,
// the dropout masks' CUDA generator included): rtol 1e-4, atol 1e-5 there, since the blocks' fused
// attention and the reference's matmul-softmax sum in other orders (fp32, no TF32).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "comm/gpu/gpu_test_util.h"
#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/parallel/tensor/blocks.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t D = 32, HEADS = 4, S = 8, B = 2;

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: shape mismatch", what);
  const double rtol = got.is_cuda() ? 1e-4 : 1e-5;
  WCHECK(at::allclose(got, want, rtol, 1e-5), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}
at::Tensor shard(const at::Tensor& t, int64_t dim, const CommPtr& tp) { return t.chunk(tp->size(), dim)[tp->rank()]; }
// The qkv rows of this rank's heads ([q | k | v] head-major → this rank's q, k, v rows).
at::Tensor qkvShard(const at::Tensor& full, const CommPtr& tp) {
  std::vector<at::Tensor> parts;
  for (auto& p : full.chunk(3, 0)) parts.push_back(shard(p, 0, tp));
  return at::cat(parts, 0);
}
}  // namespace

// arg: [cuda:]<plain|sp>[_drop] — cuda: NCCL and CUDA tensors (the GPU suite).
TESSERA_WORKER(tp_blocks) {
  const bool cuda = w.arg.rfind("cuda:", 0) == 0;
  const std::string mode = cuda ? w.arg.substr(5) : w.arg;
  auto ctx = initWorker(w, cuda ? Backend::Nccl : Backend::Gloo);
  const auto& tp = ctx.world;
  const auto dev = ctx.device;
  const bool sp = mode.rfind("sp", 0) == 0;
  const double pDrop = mode.find("_drop") != std::string::npos ? 0.25 : 0.0;
  torch::manual_seed(5);
  GptBlock r0(D, HEADS, pDrop, /*dropoutSeed=*/100), r1(D, HEADS, pDrop, 101);
  torch::manual_seed(5);
  tp::ParallelBlock p0(tp, D, HEADS, sp, "blocks.0", tp::BlockDropout{pDrop, 100});
  tp::ParallelBlock p1(tp, D, HEADS, sp, "blocks.1", tp::BlockDropout{pDrop, 101});
  for (torch::nn::Module* m : {r0.get(), r1.get()}) m->to(dev);
  for (torch::nn::Module* m : {p0.get(), p1.get()}) m->to(dev);
  // A reference [B, T, d] tensor in this rank's layout: [S, B, d], this rank's tokens with sp.
  auto local = [&](const at::Tensor& bt) {
    auto t = bt.detach().transpose(0, 1).contiguous();
    return sp ? shard(t, 0, tp) : t;
  };

  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto xFull = at::randn({B, S, D}, gen).to(dev);  // reference layout [B, T, d]
  auto gFull = at::randn({B, S, D}, gen).to(dev);
  auto xRef = xFull.clone().requires_grad_();
  auto yRef = r1->forward(r0->forward(xRef));
  (yRef * gFull).sum().backward();

  auto x = local(xFull).clone().requires_grad_();
  auto y = p1->forward(p0->forward(x));
  (y * local(gFull)).sum().backward();

  expectClose(y, local(yRef), "output");
  expectClose(x.grad(), local(xRef.grad()), "input grad");
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
  if (pDrop == 0) return;

  torch::manual_seed(5);
  GptBlock q0(D, HEADS), q1(D, HEADS);  // the same weights without dropout
  q0->to(dev);
  q1->to(dev);
  at::NoGradGuard noGrad;
  auto undropped = q1->forward(q0->forward(xFull));
  WCHECK((yRef - undropped).abs().max().item<double>() > 0.1, "dropout p = {} changed nothing", pDrop);
  // The second forward draws new masks (the blocks' RNG state advanced), again the reference's.
  auto yRef2 = r1->forward(r0->forward(xFull));
  WCHECK(!at::allclose(yRef2, yRef.detach()), "the second forward reused the first one's masks");
  expectClose(p1->forward(p0->forward(x)), local(yRef2), "second forward's output");
  // Eval mode: no dropout, and no mask drawn.
  p0->eval();
  p1->eval();
  expectClose(p1->forward(p0->forward(x)), local(undropped), "eval output");
  WCHECK(p0->dropoutCalls == 2 && p1->dropoutCalls == 2, "masked forwards counted: {}, {}", p0->dropoutCalls,
         p1->dropoutCalls);
}

struct BlockCase {
  int ranks;
  const char* mode;
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << "tp" << c.ranks << " " << c.mode; }

class TpBlocks : public ::testing::TestWithParam<BlockCase> {};

#ifndef TESSERA_TP_BLOCKS_GPU_SUITE
TEST_P(TpBlocks, StackMatchesUnshardedBlocks) {
  auto c = GetParam();
  expectAllOk(runWorkers("tp_blocks", {.ranks = c.ranks, .arg = c.mode}));
}
#endif

#ifdef TESSERA_TP_BLOCKS_GPU_SUITE
// One rank per visible GPU, up to 2 (the ranks field is unused here).
TEST_P(TpBlocks, StackMatchesUnshardedBlocksOnCuda) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto o = gpuRun(300, {}, std::string("cuda:") + GetParam().mode);
  o.ranks = std::min(2, cudaDeviceCount());
  expectAllOk(runWorkers("tp_blocks", o));
}
INSTANTIATE_TEST_SUITE_P(Cases, TpBlocks,
                         ::testing::Values(BlockCase{0, "plain"}, BlockCase{0, "sp"}, BlockCase{0, "plain_drop"},
                                           BlockCase{0, "sp_drop"}));
#else
INSTANTIATE_TEST_SUITE_P(Cases, TpBlocks,
                         ::testing::Values(BlockCase{2, "plain"}, BlockCase{4, "plain"}, BlockCase{2, "sp"},
                                           BlockCase{4, "sp"}, BlockCase{2, "plain_drop"}, BlockCase{4, "plain_drop"},
                                           BlockCase{2, "sp_drop"}, BlockCase{4, "sp_drop"}));
#endif

#ifndef TESSERA_TP_BLOCKS_GPU_SUITE  // the Gloo suite only
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

// The dropout masks are dropout masks of rate p: with the attention and MLP outputs made all ones
// (zero proj/fc2 weights, unit biases) and a zero input, the block's output is m_attn + m_mlp,
// each mask 0 or 1/(1 - p) = 2 for p = 0.5. Sequence parallel, tp 2: this rank's 64/2 tokens of
// [64, 4, 32], 4096 values. Exact values {0, 2, 4}; zeros (both dropped) at rate p² = 0.25 and
// mean 2 within 0.03 and 0.1 (> 4 standard deviations: sqrt(.25·.75/4096) = 0.007 and
// sqrt(2/4096) = 0.022). p outside [0, 1) is an error naming the block.
TESSERA_WORKER(tp_block_dropout_rate) {
  auto ctx = initWorker(w);
  tp::ParallelBlock b(ctx.world, D, HEADS, /*sp=*/true, "blocks.3", tp::BlockDropout{0.5, 7});
  {
    at::NoGradGuard g;
    for (auto* l : {&b->attn->proj->weight, &b->mlp->fc2->weight}) l->zero_();
    for (auto* l : {&b->attn->proj->bias, &b->mlp->fc2->bias}) l->fill_(1);
  }
  auto y = b->forward(at::zeros({64 / ctx.world->size(), 4, D})).detach();
  auto valid = (y == 0).logical_or(y == 2).logical_or(y == 4);
  WCHECK(valid.all().item<bool>(), "values other than 0, 2, 4: {}",
         y.masked_select(valid.logical_not())[0].item<double>());
  const double zeros = (y == 0).to(at::kDouble).mean().item<double>(), mean = y.mean().item<double>();
  WCHECK(std::abs(zeros - 0.25) < 0.03 && std::abs(mean - 2) < 0.1, "zeros {} (want 0.25), mean {} (want 2)", zeros,
         mean);
  for (double p : {-0.1, 1.0})
    expectErrorContaining([&] { tp::ParallelBlock(ctx.world, D, HEADS, false, "blocks.4", tp::BlockDropout{p, 0}); },
                          {"'blocks.4'", "dropout", fmt::format("p = {}", p).c_str(), "[0, 1)"});
}

TEST(TpBlocks, DropoutMasksHaveRateP) { expectAllOk(runWorkers("tp_block_dropout_rate", {.ranks = 2})); }
#endif
