// Bucket assignment (pure): caps, the smaller first bucket, dtype groups, oversized params.
#include <gtest/gtest.h>

#include "parallel/data_parallel/ddp/buckets.h"

using tessera::ddp::assignBuckets;
using tessera::ddp::BucketParam;
using V = std::vector<std::vector<int>>;

TEST(DdpBuckets, FirstBucketSmallerThenCap) {
  std::vector<BucketParam> p(6, BucketParam{40, 0});
  // A bucket closes once it holds its cap: first cap 50 bytes → two params (80); cap 100 →
  // three (120); the rest stays open.
  EXPECT_EQ(assignBuckets({5, 4, 3, 2, 1, 0}, p, 100, 50), (V{{5, 4}, {3, 2, 1}, {0}}));
}

TEST(DdpBuckets, SmallParamsRideWithTheNextLargeOne) {
  // bias, weight, bias, weight (as a transformer's layers): no bias-only buckets.
  std::vector<BucketParam> p = {{10, 0}, {500, 0}, {10, 0}, {500, 0}};
  EXPECT_EQ(assignBuckets({0, 1, 2, 3}, p, 100, 100), (V{{0, 1}, {2, 3}}));
}

TEST(DdpBuckets, DtypeGroupsNeverShareABucket) {
  std::vector<BucketParam> p = {{10, 0}, {10, 1}, {10, 0}, {10, 1}};
  EXPECT_EQ(assignBuckets({0, 1, 2, 3}, p, 20, 20), (V{{0, 2}, {1, 3}}));
}

TEST(DdpBuckets, OrderIsFollowed) {
  std::vector<BucketParam> p(4, BucketParam{10, 0});
  EXPECT_EQ(assignBuckets({2, 0, 3, 1}, p, 20, 20), (V{{2, 0}, {3, 1}}));  // 20 bytes: closes at two
}

// The rebuild order agreed after the first backward must be a permutation: a duplicate (a
// parameter counted twice) would leave a bucket waiting forever for a gradient.
TEST(DdpBuckets, OrderMustBeAPermutation) {
  using tessera::ddp::orderProblem;
  EXPECT_EQ(orderProblem({2, 0, 1}, 3), "");
  EXPECT_EQ(orderProblem({2, 0, 2, 1}, 3), "index 2 appears twice");
  EXPECT_EQ(orderProblem({2, 0}, 3), "index 1 is missing");
  EXPECT_EQ(orderProblem({2, 0, 3}, 3), "index 3 is out of range");
  EXPECT_EQ(orderProblem({1, 1, 0}, 3, {"a", "b", "c"}), "index 1 ('b') appears twice");
  std::vector<BucketParam> p(3, BucketParam{10, 0});
  try {
    assignBuckets({0, 1, 1, 2}, p, 20, 20);
    FAIL() << "a duplicate index was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("index 1 appears twice"), std::string::npos) << e.what();
  }
}
