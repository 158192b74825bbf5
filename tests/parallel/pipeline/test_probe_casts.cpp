// The executor's shape probe and autocast's cast cache: on one GPU (test_pipeline_gpu, CUDA autocast,
// PyTorch 2.11) and on the CPU (test_pipeline, LibTorch 1.13's CPU autocast to bf16). train_gpt
// runs each step inside a CudaAutocastCacheScope (one cast per weight per step). The probe of step 1
// ran its forward inside that scope, so its casts served the step's forward: on PyTorch 2.11 with a
// grad_fn made before that forward, which autograd's ready queue (highest sequence number first) ran
// last in backward. A tied table's gradient-ready hook then fired last in step 1, and DDP built its
// buckets from that order (the 1 GB table in the last bucket, all-reduced after backward's last GEMM).
// Here a stage of two linears on float32 leaves steps through a one-rank executor inside the scope:
// an early weight u cast explicitly in the forward (as train_gpt's block ops take their weights,
// with autograd edges made in the real forward) and a late "head" weight cast by autocast's cache.
// In every step's backward (one micro-batch), the first step's included, the head's gradient must be
// ready before u's, and both gradients must equal plain autograd's. (With several micro-batches the
// step's later forwards reuse the first one's cast by design, so there the head's hook comes last.)
// On LibTorch 1.13 a cast cached under no_grad has no grad_fn: without the fix the head gets no
// gradient in step 1 (one hook fires, not two).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/autocast.h"
#include "harness/multiprocess.h"
#include "tessera/parallel/pipeline/executor.h"

using namespace tessera;
using namespace tessera::pipeline;
using namespace tessera::testing;

namespace {
// bf16 autocast on the worker's device while alive (CUDA: Bf16Autocast; CPU: the CPU autocast).
class Autocast {
 public:
  explicit Autocast(bool cuda) : cuda_(cuda) {
    if (cuda_) {
      gpu_.emplace(true);
      return;
    }
#if TORCH_VERSION_MAJOR >= 2
    prev_ = at::autocast::is_autocast_enabled(at::kCPU), prevDtype_ = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
#else
    prev_ = at::autocast::is_cpu_enabled(), prevDtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
#endif
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (cuda_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if TORCH_VERSION_MAJOR >= 2
    at::autocast::set_autocast_enabled(at::kCPU, prev_);
    at::autocast::set_autocast_dtype(at::kCPU, prevDtype_);
#else
    at::autocast::set_cpu_enabled(prev_);
    at::autocast::set_autocast_cpu_dtype(prevDtype_);
#endif
  }

 private:
  bool cuda_, prev_ = false;
  at::ScalarType prevDtype_ = at::kBFloat16;
  std::optional<Bf16Autocast> gpu_;
};

// The order in which parameters' AccumulateGrad post hooks fire (as DDP's ready hooks do).
struct ReadyOrder {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<torch::autograd::Node>> keep;
  void watch(const at::Tensor& p, std::string name) {
    auto acc = torch::autograd::impl::grad_accumulator(p);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, name](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          names.push_back(name);
          return out;
        }));
    keep.push_back(std::move(acc));
  }
};
}  // namespace

TESSERA_WORKER(pp_probe_casts) {
  const bool cuda = w.arg == "dev=cuda";
  auto ctx = initWorker(w, cuda ? Backend::Nccl : Backend::Gloo);
  const auto dev = ctx.device;
  at::manual_seed(5);
  const auto opt = at::TensorOptions().device(dev);
  auto u = (at::randn({64, 64}, opt) * 0.1).requires_grad_(true);
  auto head = (at::randn({96, 64}, opt) * 0.1).requires_grad_(true);
  ReadyOrder order;
  order.watch(u, "u");
  order.watch(head, "head");
  auto forward = [cuda](const at::Tensor& x, const at::Tensor& early, const at::Tensor& late) {
    Autocast autocast(cuda);
    auto h = at::relu(at::linear(x.to(at::kBFloat16), early.to(at::kBFloat16)));  // casts made here, uncached
    return at::linear(h, late);  // autocast casts `late` through its cache
  };
  auto stage = [&](const at::Tensor& x) { return forward(x, u, head); };
  auto loss = [](const at::Tensor& y, const at::Tensor& t) { return at::cross_entropy_loss(y.to(at::kFloat), t); };
  ExecutorOptions eo;
  eo.device = dev;
  PipelineExecutor exec(ctx.world, makeSchedule(ScheduleKind::OneFOneB, 1, 1, 1), {stage}, loss, eo);
  for (int step = 0; step < 3; ++step) {
    auto x = at::randn({8, 64}, opt);
    auto t = at::randint(0, 96, {8}, opt.dtype(at::kLong));
    order.names.clear();
    u.mutable_grad() = at::Tensor(), head.mutable_grad() = at::Tensor();
    {
      CudaAutocastCacheScope castOncePerStep(true);  // as train_gpt's step (the cache serves CPU autocast too)
      exec.step(x, t);
    }
    WCHECK(order.names.size() == 2, "step {}: {} gradient-ready hooks fired, expected 2", step, order.names.size());
    WCHECK(order.names[0] == "head", "step {}: u's gradient was ready before the head's: a cast from the executor's "
           "probe served the forward", step);
    // Plain autograd on the same batch, autocast without the step's cache scope.
    auto ru = u.detach().clone().requires_grad_(true), rh = head.detach().clone().requires_grad_(true);
    loss(forward(x, ru, rh), t).backward();
    const double du = (u.grad() - ru.grad()).abs().max().item<double>();
    const double dh = (head.grad() - rh.grad()).abs().max().item<double>();
    WCHECK(head.grad().abs().max().item<double>() > 0 && du < 1e-4 && dh < 1e-4,
           "step {}: gradients differ from plain autograd (u {}, head {})", step, du, dh);
  }
}

#ifdef TESSERA_PP_GPU_SUITE
TEST(PipelineGpu, ProbeCastsDoNotServeTheStep) {
  TESSERA_REQUIRE_GPUS(1);
  auto o = gpuRun(120, {}, "dev=cuda");
  o.ranks = 1;
  expectAllOk(runWorkers("pp_probe_casts", o));
}
#else
TEST(Pipeline, ProbeCastsDoNotServeTheStep) { expectAllOk(runWorkers("pp_probe_casts", {.ranks = 1})); }
#endif
