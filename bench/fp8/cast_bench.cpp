// The FP8 pieces alone on one GPU (issue 37: what separates train_gpt --fp8 from its targets,
// kernel by kernel): for bfloat16 activations of llama shapes, the time and effective bandwidth of
// a plain copy (the memory's pace), the tensorwise cast with its amax (codes; codes and transposed
// codes), the cast alone from a given amax; then cuBLASLt's FP8 GEMM (tensorwise, bf16 output,
// with and without fast accumulation) beside ATen's bf16 GEMM on the same shapes, in TFLOP/s.
// Each figure: the mean over 20 runs after 3 warm-ups, the device synchronised around them.
// Prints Markdown tables.   tessera_bench_fp8 [--iters N]
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tessera/common/error.h"
#include "kernels/fp8.h"

using namespace tessera;
using fp8::Axis;
using fp8::Format;

namespace {
int gIters = 20;

double meanMs(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < gIters; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / gIters;
}
}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i + 1 < argc; i += 2) {
    TESSERA_CHECK(std::string(argv[i]) == "--iters", "tessera_bench_fp8: unknown argument '{}'", argv[i]);
    gIters = std::stoi(argv[i + 1]);
  }
  TESSERA_CHECK(torch::cuda::is_available(), "tessera_bench_fp8: needs a GPU");
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  fmt::print("| bf16 [m, k] | copy µs (GB/s) | amax + cast µs (GB/s) | amax + cast + transpose µs (GB/s) | cast + "
             "transpose alone µs (GB/s) |\n|---|---|---|---|---|\n");
  for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{{8192, 2048}, {8192, 8192}, {8192, 16384}, {8192, 4096},
                                                              {8192, 28672}}) {
    auto x = at::randn({m, k}, bf16), y = at::empty_like(x);
    const double n = static_cast<double>(m * k);
    auto gbs = [&](double ms, double bytesPerValue) { return n * bytesPerValue / (ms * 1e6); };
    const double copy = meanMs([&] { y.copy_(x); });
    kernels::Fp8QuantizeOptions codes, both, given;
    both.transposed = true;
    given.transposed = true;
    given.amax = at::full({1}, 4.0f, bf16.dtype(at::kFloat));
    const double q1 = meanMs([&] { kernels::fp8Quantize(x, Format::E4M3, Axis::Tensor, codes); });
    const double q2 = meanMs([&] { kernels::fp8Quantize(x, Format::E4M3, Axis::Tensor, both); });
    const double q3 = meanMs([&] { kernels::fp8Quantize(x, Format::E4M3, Axis::Tensor, given); });
    // Bytes moved: copy 2 + 2; amax 2, cast 2 + 1 (+ 1 transposed).
    fmt::print("| [{}, {}] | {:.1f} ({:.0f}) | {:.1f} ({:.0f}) | {:.1f} ({:.0f}) | {:.1f} ({:.0f}) |\n", m, k, copy * 1e3,
               gbs(copy, 4), q1 * 1e3, gbs(q1, 5), q2 * 1e3, gbs(q2, 6), q3 * 1e3, gbs(q3, 4));
  }
  fmt::print("\n| GEMM [m, k]·[n, k]ᵀ | bf16 (at::mm) TFLOP/s | FP8 TFLOP/s | FP8 fast accumulation TFLOP/s |\n"
             "|---|---|---|---|\n");
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {8192, 3072, 2048}, {8192, 16384, 2048}, {8192, 2048, 8192}, {2048, 8192, 8192}, {8192, 6144, 4096},
           {8192, 28672, 4096}, {8192, 4096, 14336}, {4096, 14336, 8192}}) {
    auto a = at::randn({m, k}, bf16), b = at::randn({n, k}, bf16);
    const auto qa = kernels::fp8Quantize(a, Format::E4M3, Axis::Tensor);
    const auto qb = kernels::fp8Quantize(b, Format::E4M3, Axis::Tensor);
    const double flop = 2.0 * m * n * k;
    const double mm = meanMs([&] { at::mm(a, b.t()); });
    kernels::Fp8GemmOptions slow, fast;
    fast.fastAccum = true;
    const double f8 = meanMs([&] {
      kernels::fp8Gemm(qa.codes, qa.scaleInv, Format::E4M3, qb.codes, qb.scaleInv, Format::E4M3, at::kBFloat16, slow);
    });
    const double f8f = meanMs([&] {
      kernels::fp8Gemm(qa.codes, qa.scaleInv, Format::E4M3, qb.codes, qb.scaleInv, Format::E4M3, at::kBFloat16, fast);
    });
    fmt::print("| [{}, {}]·[{}, {}]ᵀ | {:.0f} | {:.0f} | {:.0f} |\n", m, k, n, k, flop / (mm * 1e9), flop / (f8 * 1e9),
               flop / (f8f * 1e9));
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "tessera_bench_fp8: {}\n", e.what());
  return 1;
}
