// Seeded initial weights in parallel blocks (contract in init.h).
#include "tessera/nn/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "tessera/common/error.h"
#include "data/random.h"

namespace tessera::nn {
namespace {

// splitmix64 (one step of data::Rng's stream): decorrelates the generators of neighbouring blocks
// and seeds.
uint64_t mix(uint64_t x) { return data::Rng(x).next(); }

}  // namespace

at::Tensor seededNormal(int64_t rows, int64_t cols, double mean, double std, uint64_t seed) {
  TESSERA_CHECK(rows >= 0 && cols >= 0, "nn::seededNormal: shape [{}, {}] has a negative dimension", rows, cols);
  auto out = at::empty({rows, cols}, at::kFloat);
  if (out.numel() == 0) return out;
  const int64_t blockRows = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(cols, 1));
  const int64_t blocks = (rows + blockRows - 1) / blockRows;
  auto fill = [&](int64_t b) {
    auto gen = at::detail::createCPUGenerator(mix(mix(seed) + static_cast<uint64_t>(b)));
    const int64_t r0 = b * blockRows;
    out.narrow(0, r0, std::min(blockRows, rows - r0)).normal_(mean, std, gen);
  };
  const int64_t threads = std::min<int64_t>({blocks, 16, std::max(1u, std::thread::hardware_concurrency())});
  if (threads <= 1) {
    for (int64_t b = 0; b < blocks; ++b) fill(b);
    return out;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (int64_t b; (b = next.fetch_add(1)) < blocks;) fill(b);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace tessera::nn
