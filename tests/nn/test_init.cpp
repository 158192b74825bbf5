// nn::seededNormal (src/nn/init.h): its threaded block fill against the contract written out
// serially (block b of max(1, 2^20 / cols) rows from a generator seeded splitmix64(splitmix64(seed)
// + b)), the same values on every call, the distribution asked for, and bad shapes. The Python
// replicas (tests/models/torch_llama.py, python/tessera/llama.py) are held to the C++ values by
// tests/models/llama_golden.py.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "tessera/common/error.h"
#include "tessera/nn/init.h"

using namespace tessera;

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

TEST(SeededNormal, BlocksFollowTheContract) {
  for (const auto& [rows, cols, seed] : std::vector<std::tuple<int64_t, int64_t, uint64_t>>{
           {3000, 700, 5}, {7, 3, 0}, {2, 1 << 21, ~0ull}, {4097, 256, 123456789}}) {
    const auto got = nn::seededNormal(rows, cols, 0.5, 2.0, seed);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{rows, cols}));
    const int64_t block = std::max<int64_t>(1, (int64_t{1} << 20) / cols);
    auto want = at::empty({rows, cols});
    for (int64_t b = 0, r0 = 0; r0 < rows; ++b, r0 += block) {
      auto gen = at::detail::createCPUGenerator(splitmix(splitmix(seed) + static_cast<uint64_t>(b)));
      want.narrow(0, r0, std::min(block, rows - r0)).normal_(0.5, 2.0, gen);
    }
    EXPECT_TRUE(at::equal(got, want)) << rows << " x " << cols << " seed " << seed;
    EXPECT_TRUE(at::equal(got, nn::seededNormal(rows, cols, 0.5, 2.0, seed))) << "a second call differs";
  }
}

TEST(SeededNormal, DrawsTheDistributionAskedFor) {
  const auto x = nn::seededNormal(2048, 1024, 0.25, 0.02, 9);  // 2 M values over two blocks
  EXPECT_NEAR(x.mean().item<double>(), 0.25, 1e-4);
  EXPECT_NEAR(x.std().item<double>(), 0.02, 1e-4);
  // Neighbouring blocks and seeds are not copies of each other.
  EXPECT_FALSE(at::equal(x.narrow(0, 0, 1024), x.narrow(0, 1024, 1024)));
  EXPECT_FALSE(at::equal(x, nn::seededNormal(2048, 1024, 0.25, 0.02, 10)));
}

TEST(SeededNormal, EmptyAndBadShapes) {
  EXPECT_EQ(nn::seededNormal(0, 5, 0, 1, 1).numel(), 0);
  EXPECT_THROW(nn::seededNormal(-1, 5, 0, 1, 1), Error);
}

}  // namespace
