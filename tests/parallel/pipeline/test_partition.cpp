// Stage partitions (no processes): balanced by parameter count with the embedding counted
// on the first stage and the head on the last, explicit layers per stage, virtual stages,
// and impossible splits as errors naming the numbers; no block is ever dropped.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/partition.h"

using namespace tessera::pipeline;

namespace {
void expectCovers(const Partition& p, int n) {
  ASSERT_EQ(static_cast<int>(p.bounds.size()), p.numStages() + 1);
  EXPECT_EQ(p.bounds.front(), 0);
  EXPECT_EQ(p.bounds.back(), n) << p.describe();
  for (int s = 0; s < p.numStages(); ++s) EXPECT_LT(p.bounds[s], p.bounds[s + 1]) << p.describe();
}
std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Partition, BalancedEqualBlocks) {
  auto p = partitionBlocks(std::vector<int64_t>(8, 10), {.pp = 4});
  expectCovers(p, 8);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 2, 4, 6, 8}));
}

TEST(Partition, BalancedCountsEmbeddingAndHead) {
  // Embedding as heavy as 2 blocks: stage 0 gets fewer blocks; the head as heavy as 1 block.
  PartitionOptions o{.pp = 3};
  o.embeddingParams = 20;
  o.headParams = 10;
  auto p = partitionBlocks(std::vector<int64_t>(9, 10), o);
  expectCovers(p, 9);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 2, 6, 9})) << p.describe();
  EXPECT_EQ(p.params, (std::vector<int64_t>{40, 40, 40}));
}

// Balancing by compute: the embedding (a lookup) costs nothing, the head costs its parameters.
// 12 blocks of 10, embedding 20, head 20: by storage 6 + 6 (stages of 80 and 80); by compute
// 7 + 5 (costs 70 and 70; stage 0 still holds the embedding's 20 parameters).
TEST(Partition, EmbeddingAsLookupMovesBlocksToTheFirstStage) {
  PartitionOptions o{.pp = 2};
  o.embeddingParams = 20;
  o.headParams = 20;
  auto byParams = partitionBlocks(std::vector<int64_t>(12, 10), o);
  EXPECT_EQ(byParams.bounds, (std::vector<int>{0, 6, 12}));
  EXPECT_EQ(byParams.params, (std::vector<int64_t>{80, 80}));
  o.embeddingIsLookup = true;
  auto byCompute = partitionBlocks(std::vector<int64_t>(12, 10), o);
  expectCovers(byCompute, 12);
  EXPECT_EQ(byCompute.bounds, (std::vector<int>{0, 7, 12}));
  EXPECT_EQ(byCompute.params, (std::vector<int64_t>{90, 70}));
}

TEST(Partition, BalancedUnevenBlocksMinimisesTheLargestStage) {
  auto p = partitionBlocks({5, 5, 5, 30, 5, 5}, {.pp = 3});
  expectCovers(p, 6);
  EXPECT_EQ(*std::max_element(p.params.begin(), p.params.end()), 30) << p.describe();
}

TEST(Partition, ExplicitAndVirtualStages) {
  PartitionOptions o{.pp = 2, .chunks = 2};
  o.layersPerStage = {1, 2, 2, 1};
  auto p = partitionBlocks(std::vector<int64_t>(6, 1), o);
  EXPECT_EQ(p.bounds, (std::vector<int>{0, 1, 3, 5, 6}));
  EXPECT_EQ(p.stageOf(1, 1), 3);
  auto b = partitionBlocks(std::vector<int64_t>(8, 1), {.pp = 2, .chunks = 2});
  EXPECT_EQ(b.bounds, (std::vector<int>{0, 2, 4, 6, 8}));
}

TEST(Partition, ImpossibleSplitsAreClearErrors) {
  auto e = errorOf([] { partitionBlocks(std::vector<int64_t>(3, 1), {.pp = 2, .chunks = 2}); });
  EXPECT_NE(e.find("cannot split 3 blocks into 4 stages (pp 2 x 2 chunks)"), std::string::npos) << e;
  PartitionOptions o{.pp = 2};
  o.layersPerStage = {3, 2};
  e = errorOf([&] { partitionBlocks(std::vector<int64_t>(6, 1), o); });
  EXPECT_NE(e.find("sum to 5, but the model has 6 blocks"), std::string::npos) << e;
  o.layersPerStage = {6, 0};
  e = errorOf([&] { partitionBlocks(std::vector<int64_t>(6, 1), o); });
  EXPECT_NE(e.find("stage 1 has 0 blocks"), std::string::npos) << e;
  o.layersPerStage = {2, 2, 2};
  e = errorOf([&] { partitionBlocks(std::vector<int64_t>(6, 1), o); });
  EXPECT_NE(e.find("has 3 entries, but pp 2 x 1 chunks = 2 stages"), std::string::npos) << e;
}

namespace {
struct TanhBlockImpl : torch::nn::Module {
  explicit TanhBlockImpl(int64_t d) : fc(register_module("fc", torch::nn::Linear(d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc->forward(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(TanhBlock);
}  // namespace

TEST(Partition, StagesComposeToTheWholeModel) {
  torch::manual_seed(3);
  SequentialModel m;
  m.embedding = torch::nn::AnyModule(torch::nn::Linear(4, 6));
  for (int i = 0; i < 5; ++i) m.blocks.emplace_back(TanhBlock(6));
  m.head = torch::nn::AnyModule(torch::nn::Linear(6, 2));
  auto p = partitionModel(m, {.pp = 3});
  expectCovers(p, 5);
  auto x = torch::randn({3, 4});
  auto y = x;
  size_t params = 0;
  for (int s = 0; s < 3; ++s) {
    auto st = buildStage(m, p, s);
    y = st.forward(y);
    params += st.parameters.size();
  }
  auto h = m.embedding.forward(x);
  for (auto& b : m.blocks) h = b.forward(h);
  auto want = m.head.forward(h);
  EXPECT_TRUE(y.equal(want));
  EXPECT_EQ(params, 2u * 7u);
}
