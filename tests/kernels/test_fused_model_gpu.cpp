// One training step of the models with tessera's fused kernels (models::LayerOptions::fusedKernels,
// lmLoss's fused cross-entropy, optim::AdamW's multi-tensor kernel: what train_gpt
// --fused-kernels on runs) against the same step with ATen's ops, on one GPU: the GPT with
// rotary positions (LayerNorm, rotary embedding, bias + GELU) and with learned positions, and the
// Llama (RMSNorm, rotary with GQA, SwiGLU, tied embeddings; also with selective recompute on the fused
// side), same weights and batch.
// - float32: the same maths in another order: loss within 1e-5 relative, each parameter's
//   gradient within 1e-4 of its norm.
// - bf16 autocast: the fused ops round each activation once where ATen's ops round after each op
//   (2 to 4 roundings of 2^-9 each), and these differences are independent from element to
//   element: the loss within 3·2^-9 relative; each gradient within 5 % of its norm (the
//   roundings compound through the layers' backward). A fused op that is wrong (a missed bias,
//   the wrong rotation) moves a gradient by far more than 5 %.
// - Then one AdamW step (lr 1e-3; multi-tensor on the fused side) and the loss of a second forward
//   on the same batch, within the same loss tolerance. (Not the parameters themselves: AdamW's
//   first step moves each by lr·sign(g), so an element whose gradient is below the rounding noise
//   may move the other way on one side; a few such elements barely move the loss, a broken
//   update moves it by far more.)
// Skips visibly without a GPU or a CUDA LibTorch. The model's tensor-parallel group is an NCCL group
// of one (no communication happens in a group of one; the GPU image's LibTorch has no Gloo), the
// tensors are CUDA tensors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "comm/gpu/gpu_test_util.h"
#include "tessera/common/autocast.h"
#include "tessera/models/lm.h"
#include "tessera/optim/adamw.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::testing;

namespace {

struct Step {
  double loss = 0, lossAfter = 0;  // before and after one AdamW step
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

Step runStep(const ModelConfig& c, const CommPtr& g, bool fused, bool bf16, const at::Tensor& tokens,
             const at::Tensor& targets, nn::Recompute recompute = nn::Recompute::None,
             const at::Device dev = at::Device(at::kCUDA, 0)) {
  LayerOptions o;
  o.seed = 5;
  o.fusedKernels = fused;
  o.recompute = recompute;
  LmChunk m(c, g, nullptr, ChunkRange::whole(c), o);
  m->to(dev);
  auto forward = [&] {
    Bf16Autocast autocast(bf16);
    return lmLoss(m->forward(tokens.to(dev)), targets.to(dev), g, c.vocab, fused);
  };
  at::Tensor loss = forward();
  loss.backward();
  Step s;
  s.loss = loss.item<double>();
  std::vector<at::Tensor> ps;
  std::vector<std::string> names;
  std::vector<bool> decay;
  for (const auto& p : m->params()) {
    s.grads.emplace_back(p.name, p.tensor.grad().detach().cpu().to(at::kDouble));
    ps.push_back(p.tensor);
    names.push_back(p.name);
    decay.push_back(optim::decaysByName(p.name, true));
  }
  AdamWOptions ao;
  ao.lr = 1e-3;
  ao.weightDecay = 0.1;
  optim::AdamW adam(ps, names, decay, ao, /*multiTensor=*/fused);
  adam.step();
  at::NoGradGuard noGrad;
  s.lossAfter = forward().item<double>();
  return s;
}

double relNorm(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

TESSERA_WORKER(fused_model_step) {
  auto ctx = initWorker(w, Backend::Nccl);
  const bool bf16 = w.arg == "bf16";
  const double lossTol = bf16 ? 3.0 / 512 : 1e-5, gradTol = bf16 ? 0.05 : 1e-4;
  // llama-selective: the fused side under --recompute selective (the SwiGLU product recomputed in
  // w2's backward, nn::swigluLinear, through autocast's weight cast).
  for (const std::string name : {"gpt-rope", "gpt-learned", "llama", "llama-selective"}) {
    const bool llama = name.rfind("llama", 0) == 0;
    ModelConfig c = presetConfig(llama ? "llama-tiny" : "tiny");
    c.layers = 2, c.vocab = 512, c.seqLen = 64;
    if (name == "gpt-rope") c.positions = Positions::Rope;
    auto gen = at::detail::createCPUGenerator(17);
    auto tokens = at::randint(0, c.vocab, {4, c.seqLen}, gen, at::kLong);
    auto targets = at::randint(0, c.vocab, {4, c.seqLen}, gen, at::kLong);
    const auto plain = runStep(c, ctx.world, false, bf16, tokens, targets);
    const auto fused = runStep(c, ctx.world, true, bf16, tokens, targets,
                               name == "llama-selective" ? nn::Recompute::Selective : nn::Recompute::None);
    const double dl = std::abs(fused.loss - plain.loss) / std::abs(plain.loss);
    fmt::print("{} {}: loss {} (ATen ops) vs {} (fused), relative {:.3g}\n", name, bf16 ? "bf16" : "fp32", plain.loss,
               fused.loss, dl);
    WCHECK(dl <= lossTol, "{}: loss {} vs {}: relative {} > {}", name, fused.loss, plain.loss, dl, lossTol);
    double worstGrad = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      const double e = relNorm(fused.grads[i].second, plain.grads[i].second);
      worstGrad = std::max(worstGrad, e);
      WCHECK(e <= gradTol, "{}: gradient of {}: relative norm {} > {}", name, plain.grads[i].first, e, gradTol);
    }
    const double da = std::abs(fused.lossAfter - plain.lossAfter) / std::abs(plain.lossAfter);
    fmt::print("{} {}: largest relative gradient difference {:.3g}; loss after AdamW {} vs {}, relative {:.3g}\n",
               name, bf16 ? "bf16" : "fp32", worstGrad, plain.lossAfter, fused.lossAfter, da);
    WCHECK(plain.lossAfter < plain.loss, "{}: AdamW's step did not lower the loss ({} -> {})", name, plain.loss,
           plain.lossAfter);
    WCHECK(da <= lossTol, "{}: loss after AdamW {} vs {}: relative {} > {}", name, fused.lossAfter, plain.lossAfter, da,
           lossTol);
  }
}

// An odd vocabulary (509): on the GPU the head's rows are padded to 512 and the logits are a view
// of the aligned buffer (LmChunkImpl::applyHead); on the CPU they are not. fp32, untied and tied,
// fused and not: the same loss and gradients (a padded column leaking into the softmax would move
// the loss by about 3/509 relative; a misplaced gradient row, a gradient by far more than 1e-3).
TESSERA_WORKER(padded_head) {
  auto ctx = initWorker(w, Backend::Nccl);
  at::globalContext().setAllowTF32CuBLAS(false);
  for (const bool tied : {false, true}) {
    for (const bool fused : {false, true}) {
      ModelConfig c = presetConfig("llama-tiny");
      c.layers = 2, c.vocab = 509, c.seqLen = 64, c.tiedEmbeddings = tied;
      auto gen = at::detail::createCPUGenerator(23);
      auto tokens = at::randint(0, c.vocab, {4, c.seqLen}, gen, at::kLong);
      auto targets = at::randint(0, c.vocab, {4, c.seqLen}, gen, at::kLong);
      const auto gpu = runStep(c, ctx.world, fused, false, tokens, targets);
      const auto cpu = runStep(c, ctx.world, fused, false, tokens, targets, nn::Recompute::None, at::kCPU);
      const auto name = fmt::format("vocab 509 {} {}", tied ? "tied" : "untied", fused ? "fused" : "ATen ops");
      const double dl = std::abs(gpu.loss - cpu.loss) / std::abs(cpu.loss);
      double worst = 0;
      for (size_t i = 0; i < cpu.grads.size(); ++i) {
        const double e = relNorm(gpu.grads[i].second, cpu.grads[i].second);
        worst = std::max(worst, e);
        WCHECK(e <= 1e-3, "{}: gradient of {}: relative norm {} > 1e-3", name, cpu.grads[i].first, e);
      }
      fmt::print("{}: loss {} (GPU, padded) vs {} (CPU), relative {:.3g}; largest gradient difference {:.3g}\n", name,
                 gpu.loss, cpu.loss, dl, worst);
      WCHECK(dl <= 1e-5, "{}: loss {} vs {}: relative {} > 1e-5", name, gpu.loss, cpu.loss, dl);
    }
  }
}

}  // namespace

TEST(FusedModelGpu, OddVocabularyPaddedOnGpuMatchesCpu) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto r = runWorkers("padded_head", {.ranks = 1, .timeout = std::chrono::seconds(240)});
  expectAllOk(r);
  fmt::print("{}", r[0].output);
}

TEST(FusedModelGpu, OneStepFp32MatchesAtenOps) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto r = runWorkers("fused_model_step", {.ranks = 1, .timeout = std::chrono::seconds(240), .arg = "fp32"});
  expectAllOk(r);
  fmt::print("{}", r[0].output);
}

TEST(FusedModelGpu, OneStepBf16AutocastWithinBf16Tolerance) {
  TESSERA_REQUIRE_CUDA_LIBTORCH();
  auto r = runWorkers("fused_model_step", {.ranks = 1, .timeout = std::chrono::seconds(240), .arg = "bf16"});
  expectAllOk(r);
  fmt::print("{}", r[0].output);
}
