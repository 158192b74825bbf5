// fullyShard (parallel/data_parallel/fsdp/fully_shard.h): a module of one's own, its blocks in an
// nn::Blocks and its forward untouched, sharded over 2 and 3 Gloo ranks, trains as the same module
// on one process with torch's AdamW (every rank's batch in one step); and a module without Blocks
// is refused by name.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include "harness/args.h"
#include "harness/multiprocess.h"
#include "tessera/nn/blocks.h"
#include "tessera/parallel/data_parallel/fsdp/fully_shard.h"
#include "tessera/parallel/data_parallel/fsdp/optimizer.h"

namespace {
using namespace tessera;
using namespace tessera::testing;

struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 8))) {}
  at::Tensor forward(const at::Tensor& x) { return x + fc2(at::gelu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(MlpBlock);

// A model written without FSDP in mind: embedding, three blocks, a head; forward as usual.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    emb = register_module("emb", torch::nn::Embedding(32, 8));
    blocks = register_module("blocks", nn::Blocks());
    for (int i = 0; i < 3; ++i) blocks->push_back(MlpBlock());
    head = register_module("head", torch::nn::Linear(8, 32));
  }
  at::Tensor forward(const at::Tensor& tokens) { return head(blocks->forward(emb(tokens))); }
  torch::nn::Embedding emb{nullptr};
  nn::Blocks blocks{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

Net makeNet(uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

// Step s's batch of rank r: 4 sequences of 6 tokens and their targets.
std::pair<at::Tensor, at::Tensor> batch(int step, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 17 * step + rank);
  return {at::randint(0, 32, {4, 6}, gen, at::kLong), at::randint(0, 32, {4, 6}, gen, at::kLong)};
}

at::Tensor loss(const at::Tensor& logits, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, 32}), y.reshape({-1}));
}

TESSERA_WORKER(fully_shard_train) {
  auto ctx = initWorker(w);
  auto net = makeNet(100 + w.rank);  // different inits: rank 0's is broadcast
  auto sharded = fullyShard(net.ptr(), ctx.world);
  WCHECK(sharded.fsdp().numUnits() == 4, "{} units: expected the 3 blocks and the root", sharded.fsdp().numUnits());
  ShardedAdamW opt(sharded.fsdp(), {.lr = 1e-2});
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step, w.rank);
    loss(sharded.forward(x), y).backward();
    opt.step();
    opt.zeroGrad();
  }
  auto got = sharded.fsdp().fullStateDict();
  if (w.rank != 0) return;
  auto ref = makeNet(100);
  torch::optim::AdamW refOpt(ref->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(1e-2));
  for (int step = 0; step < 3; ++step) {
    refOpt.zero_grad();
    at::Tensor l;
    for (int r = 0; r < w.world; ++r) {  // the mean over the ranks' batches
      auto [x, y] = batch(step, r);
      auto lr = loss(ref->forward(x), y) / w.world;
      l = l.defined() ? l + lr : lr;
    }
    l.backward();
    refOpt.step();
  }
  for (const auto& p : ref->named_parameters()) {
    WCHECK(got.count(p.key()), "no '{}' in the sharded model's state", p.key());
    const double d = (got.at(p.key()) - p.value()).abs().max().item<double>();
    WCHECK(d < 1e-5, "'{}' differs from the single process by {}", p.key(), d);
  }
}

TESSERA_WORKER(fully_shard_no_blocks) {
  auto ctx = initWorker(w);
  auto plain = std::make_shared<MlpBlockImpl>();
  expectErrorContaining([&] { fullyShard(plain, ctx.world); }, {"no tessera::nn::Blocks"});
}

TEST(FullyShard, ModuleWithBlocksTrainsAsOneProcess) {
  expectAllOk(runWorkers("fully_shard_train", {.ranks = 2, .timeout = std::chrono::seconds(120)}));
  expectAllOk(runWorkers("fully_shard_train", {.ranks = 3, .timeout = std::chrono::seconds(120)}));
}

TEST(FullyShard, RefusesAModuleWithoutBlocks) {
  expectAllOk(runWorkers("fully_shard_no_blocks", {.ranks = 2, .timeout = std::chrono::seconds(60)}));
}

}  // namespace
