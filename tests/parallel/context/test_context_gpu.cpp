// Context-parallel attention's fused CUDA kernels (src/parallel/context/attention.h) against an
// fp64 CPU reference of causal attention over the whole sequence: on one GPU with a cp group of
// one, and over NCCL with cp 2 where two GPUs are visible. Chunks of an odd length (3, 37) and
// of 128, grouped-query (Hq = 4 Hkv) and multi-head, head dim 64. Every rank checks its output
// and its shares of the q, k and v gradients. Inputs and the output gradient are rounded to bf16
// first, so every dtype sees the same numbers. Tolerance, max |got - want| / max |want|:
//   bf16 (flash, efficient, math)   2e-2  (8-bit mantissa: ~4e-3 a rounding, a few in the chain)
//   fp32 (efficient; math, which is SDPA with a mask and so also a fused kernel on CUDA)
//                                   2e-3  (a TF32-level bound)
// Auto must give flash's bits for bf16 and efficient's for fp32; flash refuses fp32 by name.
// Skips visibly without a GPU, a CUDA LibTorch, or a build with the fused kernels.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/attention.h"
#include "harness/multiprocess.h"
#include "tessera/parallel/context/attention.h"
#include "tessera/parallel/context/chunks.h"
#include "reference.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
double relErr(const at::Tensor& got, const at::Tensor& want) {
  auto g = got.detach().to(at::kCPU, at::kDouble), e = want.detach().to(at::kCPU, at::kDouble);
  return ((g - e).abs().max() / e.abs().max().clamp_min(1e-30)).item<double>();
}
at::Tensor bf16Exact(const at::Tensor& x) { return x.to(at::kBFloat16).to(at::kDouble); }
}  // namespace

// arg: "<Hq>/<Hkv>".
TESSERA_WORKER(cp_fused) {
  const auto slash = w.arg.find('/');
  const int64_t hq = std::stoll(w.arg.substr(0, slash)), hkv = std::stoll(w.arg.substr(slash + 1));
  auto ctx = initWorker(w, Backend::Nccl);
  const auto& g = ctx.world;
  const int n = g->size(), r = g->rank();
  const at::Device dev = ctx.device;
  for (int64_t c : {int64_t{3}, int64_t{37}, int64_t{128}}) {
    const int64_t T = 2 * n * c, B = 2, D = 64;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(29 + c);
    auto q = bf16Exact(at::randn({T, B, hq, D}, gen, at::kDouble)).requires_grad_(true);
    auto k = bf16Exact(at::randn({T, B, hkv, D}, gen, at::kDouble)).requires_grad_(true);
    auto v = bf16Exact(at::randn({T, B, hkv, D}, gen, at::kDouble)).requires_grad_(true);
    auto gy = bf16Exact(at::randn({T, B, hq, D}, gen, at::kDouble));
    // The whole sequence, fp64 on the CPU: causal attention with each kv head repeated.
    auto ref = causalReference(q, k, v);
    (ref * gy).sum().backward();
    auto mine = [&](const at::Tensor& x) { return cp::shard(x.detach(), 0, n, r); };
    struct Case {
      cp::Kernel kernel;
      at::ScalarType dtype;
      double tol;
    };
    std::map<std::string, at::Tensor> outputs;
    for (const Case& cs : {Case{cp::Kernel::Flash, at::kBFloat16, 2e-2}, Case{cp::Kernel::Efficient, at::kBFloat16, 2e-2},
                           Case{cp::Kernel::Math, at::kBFloat16, 2e-2}, Case{cp::Kernel::Auto, at::kBFloat16, 2e-2},
                           Case{cp::Kernel::Efficient, at::kFloat, 2e-3}, Case{cp::Kernel::Math, at::kFloat, 2e-3},
                           Case{cp::Kernel::Auto, at::kFloat, 2e-3}}) {
      auto on = [&](const at::Tensor& x) { return mine(x).to(dev, cs.dtype).requires_grad_(true); };
      auto ql = on(q), kl = on(k), vl = on(v);
      auto out = cp::attention(ql, kl, vl, g, cs.kernel);
      (out * mine(gy).to(dev, cs.dtype)).sum().backward();
      const std::string what = fmt::format("{} {}", cp::kernelName(cs.kernel), c10::toString(cs.dtype));
      const std::string where = fmt::format("cp {} rank {} heads {}/{} chunk {} {}", n, r, hq, hkv, c, what);
      WCHECK(out.scalar_type() == cs.dtype && out.sizes() == mine(ref).sizes(), "{}: output {} {}", where,
             c10::toString(out.scalar_type()), c10::str(out.sizes()));
      const std::pair<at::Tensor, at::Tensor> checks[] = {
          {out, mine(ref)}, {ql.grad(), mine(q.grad())}, {kl.grad(), mine(k.grad())}, {vl.grad(), mine(v.grad())}};
      const char* names[] = {"output", "q gradient", "k gradient", "v gradient"};
      for (int i = 0; i < 4; ++i) {
        const double err = relErr(checks[i].first, checks[i].second);
        fmt::print("{}: {} rel err {:.2e} (tol {:.0e})\n", where, names[i], err, cs.tol);
        WCHECK(err <= cs.tol, "{}: {} rel err {} over {}", where, names[i], err, cs.tol);
      }
      outputs[what] = out.detach();
    }
    // Auto picks flash for bf16 and efficient for fp32 (forward kernels are deterministic).
    WCHECK(at::equal(outputs.at("auto BFloat16"), outputs.at("flash BFloat16")), "chunk {}: auto bf16 is not flash", c);
    WCHECK(at::equal(outputs.at("auto Float"), outputs.at("efficient Float")), "chunk {}: auto fp32 is not efficient", c);
    auto f32 = mine(q).to(dev, at::kFloat);
    expectErrorContaining([&] { cp::attention(f32, mine(k).to(dev, at::kFloat), mine(v).to(dev, at::kFloat), g, cp::Kernel::Flash); },
                          {"rank", "kernel flash does not take", "Float"});
  }
}

class ContextAttentionGpu : public ::testing::TestWithParam<std::string> {};
TEST_P(ContextAttentionGpu, FusedKernelsMatchWholeSequenceOneGpu) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  if (!cp::fusedKernelsBuilt()) GTEST_SKIP() << "built without the fused attention kernels (LibTorch < 2.5)";
  auto o = gpuRun(300, {}, GetParam());
  o.ranks = 1;
  expectAllOk(runWorkers("cp_fused", o));
}
TEST_P(ContextAttentionGpu, FusedKernelsMatchWholeSequenceCp2) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  TESSERA_REQUIRE_GPUS(2);
  if (!cp::fusedKernelsBuilt()) GTEST_SKIP() << "built without the fused attention kernels (LibTorch < 2.5)";
  expectAllOk(runWorkers("cp_fused", gpuRun(300, {}, GetParam())));
}
INSTANTIATE_TEST_SUITE_P(Heads, ContextAttentionGpu, ::testing::Values("8/2", "4/4"));
