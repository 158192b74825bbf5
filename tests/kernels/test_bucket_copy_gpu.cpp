// The CUDA multi-tensor bucket copy against the CPU reference on one GPU: 1..200 tensors of
// random sizes (0, odd, multi-chunk) at random, often misaligned offsets, every dtype pair and
// mixed source dtypes, scale 1 and 1/3. fp32 -> fp32 must be bitwise equal; otherwise within
// one ulp of the destination dtype (the kernel is expected to be bitwise equal throughout; the
// largest difference seen is printed). Skips visibly without a GPU or a CUDA LibTorch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/gpu/gpu_test_util.h"
#include "kernels/bucket_copy.h"
#include "kernels/bucket_copy_check.h"

using namespace tessera::kernels;
using namespace tessera::testing;

namespace {

const double kThird = 1.0 / 3.0;

std::vector<at::Tensor> cpu(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.cpu());
  return out;
}

// Mostly small tensors, some large, now and then one of several chunks.
std::vector<int64_t> randomSizes(int count, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> small(0, 3000), large(3000, 70000), huge(70000, 300000);
  std::uniform_int_distribution<int> pick(0, 19);
  std::vector<int64_t> sizes(count);
  for (auto& s : sizes) {
    const int p = pick(rng);
    s = p == 0 ? huge(rng) : p < 4 ? large(rng) : small(rng);
  }
  return sizes;
}

// Bitwise for fp32 from fp32 sources, else within one ulp; returns the ulp difference.
int64_t expectMatch(const at::Tensor& got, const at::Tensor& want, bool exact, const std::string& what) {
  const int64_t ulp = maxUlpDiff(got, want);
  if (exact) {
    EXPECT_TRUE(at::equal(bits(got), bits(want))) << what << ": not bitwise equal (" << ulp << " ulp)";
  } else {
    EXPECT_LE(ulp, 1) << what;
  }
  return ulp;
}

struct Case {
  std::vector<at::ScalarType> tensorTypes;
  std::string label;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (auto t : bucketDtypes()) c.push_back({{t}, c10::toString(t)});
  c.push_back({bucketDtypes(), "mixed"});
  return c;
}

}  // namespace

TEST(BucketCopyGpu, FlattenMatchesReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  std::mt19937 rng(11);
  at::manual_seed(11);
  int64_t worst = 0;
  for (int count : {1, 2, 47, 48, 49, 97, 200, std::uniform_int_distribution<int>(3, 199)(rng)}) {
    for (const auto& c : cases()) {
      for (auto flatT : bucketDtypes()) {
        for (double scale : {1.0, kThird}) {
          const std::string what = fmt::format("{} tensors {} -> {} scale {}", count, c.label, c10::toString(flatT), scale);
          auto l = makeLayout(randomSizes(count, rng), c.tensorTypes, dev, rng, 9);
          auto flat0 = at::randn({l.numel}).to(flatT);
          auto want = flat0.clone();
          flattenScaleCastReference(cpu(l.tensors), want, l.offsets, scale);
          auto got = flat0.to(dev);
          flattenScaleCast(l.tensors, got, l.offsets, scale);
          const bool exact = flatT == at::kFloat && c.label == "Float";
          worst = std::max(worst, expectMatch(got.cpu(), want, exact, what));
        }
      }
    }
  }
  fmt::print("flatten: largest difference from the CPU reference: {} ulp\n", worst);
}

TEST(BucketCopyGpu, UnflattenMatchesReference) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  std::mt19937 rng(12);
  at::manual_seed(12);
  int64_t worst = 0;
  for (int count : {1, 48, 49, 200}) {
    for (const auto& c : cases()) {
      for (auto flatT : bucketDtypes()) {
        const std::string what = fmt::format("{} tensors {} -> {}", count, c10::toString(flatT), c.label);
        auto l = makeLayout(randomSizes(count, rng), c.tensorTypes, dev, rng, 9);
        auto flat = at::randn({l.numel}).to(flatT);
        auto want = cpu(l.tensors);
        unflattenCastReference(flat, want, l.offsets);
        unflattenCast(flat.to(dev), l.tensors, l.offsets);
        for (size_t i = 0; i < want.size(); ++i) {
          const bool exact = flatT == at::kFloat && want[i].scalar_type() == at::kFloat;
          worst = std::max(worst, expectMatch(l.tensors[i].cpu(), want[i], exact, what + " #" + std::to_string(i)));
        }
      }
    }
  }
  fmt::print("unflatten: largest difference from the CPU reference: {} ulp\n", worst);
}

TEST(BucketCopyGpu, LargeTensorsSpanMoreChunksThanBlocks) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  at::manual_seed(13);
  // 9M elements: more chunks (8192 elements each) than the grid's blocks on any current GPU.
  for (int64_t off : {0, 1, 8}) {
    std::vector<at::Tensor> srcs = {at::randn({9000001}).to(at::kBFloat16), at::randn({3, 1001})};
    std::vector<int64_t> offsets = {off, off + 9000001};
    auto flat0 = at::zeros({off + 9000001 + 3003 + 5});
    auto want = flat0.clone();
    flattenScaleCastReference(srcs, want, offsets, kThird);
    auto got = flat0.to(dev);
    flattenScaleCast({srcs[0].to(dev), srcs[1].to(dev)}, got, offsets, kThird);
    expectMatch(got.cpu(), want, false, fmt::format("9M bf16 + fp32 at offset {}", off));
  }
}

TEST(BucketCopyGpu, InPlaceScalingOfOwnRange) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  for (auto flatT : bucketDtypes()) {
    auto flat0 = at::randn({100003}).to(flatT);
    const std::vector<int64_t> offsets = {0, 5, 1029, 90000};
    const std::vector<int64_t> sizes = {5, 1024, 88971, 10003};
    auto want = flat0.clone();
    auto flat = flat0.to(dev);
    std::vector<at::Tensor> cpuViews, devViews;
    for (size_t i = 0; i < sizes.size(); ++i) {
      cpuViews.push_back(want.narrow(0, offsets[i], sizes[i]));
      devViews.push_back(flat.narrow(0, offsets[i], sizes[i]));
    }
    flattenScaleCastReference(cpuViews, want, offsets, kThird);
    flattenScaleCast(devViews, flat, offsets, kThird);
    expectMatch(flat.cpu(), want, flatT == at::kFloat, std::string("in place ") + c10::toString(flatT));
  }
}

TEST(BucketCopyGpu, WrongDeviceGivesClearError) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const at::Device dev(at::kCUDA, 0);
  auto flat = at::zeros({16}, at::TensorOptions().device(dev));
  EXPECT_NO_THROW(expectErrorContaining([&] { flattenScaleCast({at::ones({4})}, flat, {0}, 1.0); },
                                        {"flattenScaleCast", "srcs[0] (shape [4], float32, cpu) is on cpu",
                                         "the bucket (numel 16, float32, cuda:0) is on cuda:0"}));
  EXPECT_NO_THROW(expectErrorContaining([&] { unflattenCast(flat, {at::ones({4})}, {0}); },
                                        {"unflattenCast", "dsts[0]", "is on cpu"}));
}
