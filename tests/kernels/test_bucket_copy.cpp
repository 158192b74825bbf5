// Bucket copies on CPU: the reference (and the public entry points, which use it for CPU
// tensors) against a naive per-element computation for every source/bucket dtype pair, odd
// sizes, many tensors, scale 1 and 1/3; in-place scaling; and the argument checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/multiprocess.h"
#include "kernels/bucket_copy.h"
#include "kernels/bucket_copy_check.h"

using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

const std::vector<int64_t> kSizes = {1, 7, 1031, 0, 8, 3, 1031, 64, 0, 5, 1, 7, 12, 1000, 2};
const double kThird = 1.0 / 3.0;

std::string name(at::ScalarType t) { return c10::toString(t); }

// flat0 with every tensor's range replaced by the naive scaled, rounded values.
at::Tensor naiveFlatten(const Layout& l, const at::Tensor& flat0, double scale) {
  auto out = flat0.clone();
  for (size_t i = 0; i < l.tensors.size(); ++i)
    for (int64_t k = 0; k < l.tensors[i].numel(); ++k)
      writeAt(out, l.offsets[i] + k, naiveScaled(readAt(l.tensors[i], k), scale));
  return out;
}

void expectBitwise(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(at::equal(bits(got), bits(want))) << what << ": differs in " << maxUlpDiff(got, want) << " ulp";
}

}  // namespace

TEST(BucketCopy, FlattenEveryDtypePairMatchesNaive) {
  std::mt19937 rng(1);
  at::manual_seed(1);
  for (auto srcT : bucketDtypes()) {
    for (auto flatT : bucketDtypes()) {
      for (double scale : {1.0, kThird}) {
        const std::string what = name(srcT) + " -> " + name(flatT) + " scale " + std::to_string(scale);
        auto l = makeLayout(kSizes, {srcT}, at::kCPU, rng);
        auto flat0 = at::randn({l.numel}).to(flatT);  // gaps keep these values
        auto want = naiveFlatten(l, flat0, scale);
        auto ref = flat0.clone();
        flattenScaleCastReference(l.tensors, ref, l.offsets, scale);
        expectBitwise(ref, want, "reference " + what);
        auto pub = flat0.clone();
        flattenScaleCast(l.tensors, pub, l.offsets, scale);
        expectBitwise(pub, want, "flattenScaleCast " + what);
      }
    }
  }
}

TEST(BucketCopy, FlattenManyTensorsOfMixedDtypes) {
  std::mt19937 rng(2);
  at::manual_seed(2);
  std::uniform_int_distribution<int64_t> size(0, 300);
  std::vector<int64_t> sizes(300);
  for (auto& s : sizes) s = size(rng);
  for (auto flatT : bucketDtypes()) {
    auto l = makeLayout(sizes, bucketDtypes(), at::kCPU, rng, 9);
    auto flat0 = at::randn({l.numel}).to(flatT);
    auto got = flat0.clone();
    flattenScaleCast(l.tensors, got, l.offsets, kThird);
    expectBitwise(got, naiveFlatten(l, flat0, kThird), "mixed -> " + name(flatT));
  }
}

TEST(BucketCopy, UnflattenEveryDtypePairMatchesNaive) {
  std::mt19937 rng(3);
  at::manual_seed(3);
  for (auto flatT : bucketDtypes()) {
    for (auto dstT : bucketDtypes()) {
      const std::string what = name(flatT) + " -> " + name(dstT);
      auto l = makeLayout(kSizes, {dstT}, at::kCPU, rng);
      auto flat = at::randn({l.numel}).to(flatT);
      std::vector<at::Tensor> ref, pub, want;
      for (const auto& t : l.tensors) {
        ref.push_back(at::zeros_like(t));
        pub.push_back(at::zeros_like(t));
        want.push_back(at::zeros_like(t));
        for (int64_t k = 0; k < t.numel(); ++k)
          writeAt(want.back(), k, static_cast<float>(readAt(flat, l.offsets[want.size() - 1] + k)));
      }
      auto flatBefore = flat.clone();
      unflattenCastReference(flat, ref, l.offsets);
      unflattenCast(flat, pub, l.offsets);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(ref[i].sizes(), want[i].sizes());
        expectBitwise(ref[i], want[i], "reference " + what + " tensor " + std::to_string(i));
        expectBitwise(pub[i], want[i], "unflattenCast " + what + " tensor " + std::to_string(i));
      }
      expectBitwise(flat, flatBefore, "the bucket after unflatten " + what);
    }
  }
}

TEST(BucketCopy, Fp32RoundTripIsExactAndSourcesUntouched) {
  std::mt19937 rng(4);
  at::manual_seed(4);
  auto l = makeLayout(kSizes, {at::kFloat}, at::kCPU, rng);
  std::vector<at::Tensor> before, back;
  for (const auto& t : l.tensors) {
    before.push_back(t.clone());
    back.push_back(at::empty_like(t));
  }
  auto flat = at::zeros({l.numel});
  flattenScaleCast(l.tensors, flat, l.offsets, 1.0);
  unflattenCast(flat, back, l.offsets);
  for (size_t i = 0; i < back.size(); ++i) {
    expectBitwise(back[i], before[i], "round trip tensor " + std::to_string(i));
    expectBitwise(l.tensors[i], before[i], "source tensor " + std::to_string(i));
  }
}

TEST(BucketCopy, InPlaceScalingOfTheTensorsOwnRange) {
  // gradient_as_bucket_view: the gradients are views of the bucket; scaling happens in place.
  for (auto flatT : bucketDtypes()) {
    auto flat = at::randn({1100}).to(flatT);
    const std::vector<int64_t> offsets = {0, 3, 10, 1041};
    std::vector<at::Tensor> views = {flat.narrow(0, 0, 3), flat.narrow(0, 3, 7), flat.narrow(0, 10, 1031).view({1031}),
                                     flat.narrow(0, 1041, 50).view({5, 10})};
    auto flat0 = flat.clone();
    Layout l{{}, offsets, flat.numel()};
    for (size_t i = 0; i < views.size(); ++i) l.tensors.push_back(flat0.narrow(0, offsets[i], views[i].numel()));
    auto want = naiveFlatten(l, flat0, kThird);
    flattenScaleCast(views, flat, offsets, kThird);
    expectBitwise(flat, want, "in place " + name(flatT));
    unflattenCast(flat, views, offsets);  // copying a range onto itself changes nothing
    expectBitwise(flat, want, "unflatten onto own range " + name(flatT));
  }
}

TEST(BucketCopy, EmptyInputsDoNothing) {
  auto flat = at::ones({4});
  flattenScaleCast({}, flat, {}, kThird);
  unflattenCast(flat, {}, {});
  flattenScaleCast({at::empty({0}), at::empty({0, 3})}, flat, {4, 0}, kThird);
  auto none = at::empty({0}, at::kHalf);
  flattenScaleCast({at::empty({0})}, none, {0}, 1.0);
  unflattenCast(none, {at::empty({0})}, {0});
  EXPECT_TRUE(at::equal(flat, at::ones({4})));
}

TEST(BucketCopy, BadInputsGiveClearErrors) {
  auto flat = at::zeros({20});
  auto v8 = at::ones({8});
  auto check = [](auto fn, std::initializer_list<const char*> parts) {
    EXPECT_NO_THROW(expectErrorContaining(fn, parts));
  };
  check([&] { flattenScaleCast({v8, v8}, flat, {0, 5}, 1.0); },
        {"flattenScaleCast", "srcs[1] (shape [8], float32, cpu) at offset 5 overlaps srcs[0]", "[5, 13)",
         "the bucket (numel 20, float32, cpu)"});
  check([&] { flattenScaleCast({at::ones({2, 4})}, flat, {15}, 1.0); },
        {"flattenScaleCast", "srcs[0] (shape [2, 4], float32, cpu) at offset 15", "[15, 23)",
         "outside the bucket (numel 20, float32, cpu)"});
  check([&] { flattenScaleCast({v8}, flat, {-1}, 1.0); }, {"srcs[0]", "offset -1", "outside the bucket"});
  check([&] { flattenScaleCast({at::ones({4, 3}).t()}, flat, {0}, 1.0); },
        {"flattenScaleCast", "srcs[0] (shape [3, 4], float32, cpu) is not contiguous"});
  check([&] { flattenScaleCast({v8}, at::zeros({5, 4}).t(), {0}, 1.0); },
        {"flattenScaleCast", "the bucket (numel 20, float32, cpu) is not contiguous"});
  check([&] { flattenScaleCast({v8, v8}, flat, {0}, 1.0); },
        {"flattenScaleCast", "srcs has 2 tensors but offsets has 1"});
  check([&] { unflattenCast(flat, {v8}, {0, 8}); }, {"unflattenCast", "dsts has 1 tensors but offsets has 2"});
  check([&] { flattenScaleCast({v8, at::ones({3}, at::kMeta)}, flat, {0, 9}, 1.0); },
        {"flattenScaleCast", "srcs[1] (shape [3], float32, meta) is on meta, but the bucket (numel 20, float32, cpu) is on cpu"});
  check([&] { unflattenCast(flat, {at::ones({3}, at::kDouble)}, {0}); },
        {"unflattenCast", "dsts[0] (shape [3], float64, cpu) has an unsupported dtype"});
  check([&] { flattenScaleCast({v8}, at::zeros({20}, at::kInt), {0}, 1.0); },
        {"flattenScaleCast", "the bucket (numel 20, Int, cpu) has an unsupported dtype"});
  check([&] { flattenScaleCast({at::Tensor()}, flat, {0}, 1.0); }, {"flattenScaleCast", "srcs[0] is an undefined"});
  check([&] { flattenScaleCast({flat.narrow(0, 2, 4)}, flat, {3}, 1.0); },
        {"flattenScaleCast", "srcs[0] (shape [4], float32, cpu) shares memory with the bucket", "offset 3"});
  check([&] { flattenScaleCast({flat.narrow(0, 4, 8).view(at::kHalf)}, flat, {4}, 1.0); },
        {"flattenScaleCast", "srcs[0] (shape [16], float16, cpu) shares memory", "with the bucket's dtype"});
  check([&] { unflattenCastReference(at::zeros({8}, at::kHalf), {at::zeros({8}, at::kHalf).narrow(0, 0, 4)}, {5}); },
        {"unflattenCastReference", "dsts[0] (shape [4], float16, cpu) at offset 5", "numel 8, float16, cpu"});
  check([&] { flattenScaleCast({at::ones({3}, at::kMeta)}, at::zeros({4}, at::kMeta), {0}, 1.0); },
        {"flattenScaleCast", "tensors on meta are not supported"});
}
