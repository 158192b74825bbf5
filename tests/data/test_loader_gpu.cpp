// The loader on a CUDA device (one GPU): batches prepared in pinned memory and copied
// asynchronously equal the CPU's samples, step after step, with every copy queued behind GPU work
// (a pinned buffer refilled or freed before its copy ran would show as a differing batch); a token
// outside the vocabulary still surfaces from next(). Skips visibly without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/data/dataset.h"
#include "tessera/data/loader.h"
#include "writers.h"

using namespace tessera;
using namespace tessera::data;
using namespace tessera::testing;
namespace fs = std::filesystem;

TEST(LoaderGpu, PinnedAsyncBatchesEqualTheCpuSamples) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  const auto dir = fs::temp_directory_path() / fmt::format("tessera-loader-gpu-{}", ::getpid());
  fs::create_directories(dir);
  Docs docs;
  for (int d = 0; d < 200; ++d) {
    std::vector<int64_t> doc;
    for (int i = 0; i < 50 + (d * 37) % 400; ++i) doc.push_back((d * 7919 + i * 31) % 50000);
    docs.push_back(doc);
  }
  writeMegatron((dir / "c").string(), docs);
  DataOptions o;
  o.train = (dir / "c").string();
  o.seqLen = 256;
  auto data = std::make_shared<GptData>(o);
  std::shared_ptr<const Blend> train(data, &data->train());
  const int64_t B = 8;
  LoaderOptions lo{B, 2, 4, 50000, at::Device(at::kCUDA, 0), 3};
  BatchLoader loader(train, lo, 5 * B);
  auto busy = at::randn({2048, 2048}, at::TensorOptions().device(at::kCUDA));
  // Every copy is queued behind GEMMs and nothing waits for the GPU until all 40 are taken, so
  // the loader frees and refills pinned buffers while earlier copies from them are pending.
  std::vector<TokenBatch> got;
  for (int64_t step = 5; step < 45; ++step) {
    got.push_back(loader.next());
    for (int k = 0; k < 4; ++k) busy = at::mm(busy, busy).tanh_();
  }
  for (int64_t step = 5; step < 45; ++step) {
    const auto& b = got[step - 5];
    ASSERT_TRUE(b.tokens.is_cuda());
    auto want = readSamples(*train, step * B + 2, 4, 50000);
    ASSERT_TRUE(at::equal(b.tokens.cpu(), want.narrow(1, 0, 256))) << "step " << step;
    ASSERT_TRUE(at::equal(b.targets.cpu(), want.narrow(1, 1, 256))) << "step " << step;
  }
  lo.vocab = 1000;
  BatchLoader small(train, lo, 0);
  EXPECT_THROW(
      {
        for (int s = 0; s < 10; ++s) small.next();
      },
      Error);
  // Not fs::remove_all: on the GPU image it resolves into libtorch's copy of std::filesystem and
  // crashes (src/checkpoint/checkpoint.cpp's removeTree says more).
  for (const char* f : {"c.bin", "c.idx", ""}) fs::remove(dir / f);
}
