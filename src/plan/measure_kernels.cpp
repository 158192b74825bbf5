// The calibration's elementwise kernels and AdamW, per element (contract in plan/measure.h).
#include <ATen/ATen.h>

#include <chrono>
#include <functional>

#include "kernels/cross_entropy.h"
#include "kernels/fp8.h"
#include "tessera/common/device.h"
#include "tessera/nn/fused_activations.h"
#include "tessera/nn/fused_norm.h"
#include "tessera/nn/rope.h"
#include "tessera/optim/adamw.h"
#include "tessera/plan/calibration.h"

namespace tessera::plan {

kernels::Fp8QuantizeOptions transposedCodes();  // measure.cpp

namespace {

double kernelMs(const at::Device& dev, const std::function<void()>& f, int reps) {
  f();
  synchronizeDevice(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  synchronizeDevice(dev);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// ns per element of f's forward and backward over x (elements = x.numel()).
double perElement(const at::Device& dev, const at::Tensor& x, const std::function<at::Tensor(const at::Tensor&)>& f,
                  int reps) {
  auto in = x.detach().requires_grad_(true);
  auto g = at::randn_like(f(in));
  const double ms = kernelMs(
      dev, [&] { f(in).backward(g); }, reps);
  return ms * 1e6 / static_cast<double>(x.numel());
}

}  // namespace

void measureElementwise(const at::Device& dev, Calibration& c) {
  const bool gpu = dev.is_cuda();
  const int64_t t = gpu ? 8192 : 256, d = gpu ? 4096 : 256, reps = gpu ? 20 : 3;
  const auto o = at::TensorOptions().device(dev).dtype(gpu ? at::kBFloat16 : at::kFloat);
  auto x = at::randn({t, d}, o);
  auto w = at::ones({d}, o).requires_grad_(true), b = at::zeros({d}, o).requires_grad_(true);
  c.elementNs["norm"] = perElement(
      dev, x, [&](const at::Tensor& v) { return nn::rmsNorm(v, w, 1e-5); }, reps);
  c.elementNs["layernorm"] = perElement(
      dev, x, [&](const at::Tensor& v) { return nn::layerNorm(v, w, b, 1e-5); }, reps);
  c.elementNs["swiglu"] = perElement(
      dev, x, [](const at::Tensor& v) { return nn::swiglu(v); }, reps);
  c.elementNs["gelu"] = perElement(
      dev, x, [&](const at::Tensor& v) { return nn::biasGelu(v, b); }, reps);
  c.elementNs["add"] = perElement(
      dev, x, [&](const at::Tensor& v) { return v + x; }, reps);
  const int64_t hd = 128, heads = d / hd;
  auto tables = nn::ropeTables(t, hd, 500000, {}, dev);
  auto h = at::randn({t, 1, d + 2 * hd}, o);  // q of `heads` heads, k and v of one head each
  c.elementNs["rope"] =
      perElement(
          dev, h, [&](const at::Tensor& v) { return nn::ropeQkInPlace(v * 1, heads + 1, tables); }, reps) *
      static_cast<double>(d + 2 * hd) / static_cast<double>(d + hd);
  const double castMs = kernelMs(
      dev, [&] { kernels::fp8Quantize(x, fp8::Format::E4M3, fp8::Axis::Tensor, transposedCodes()); }, reps);
  c.elementNs["cast"] = castMs * 1e6 / static_cast<double>(x.numel());
  const int64_t vocab = gpu ? 32768 : 1024;
  auto logits = at::randn({t, vocab}, o);
  auto targets = at::randint(vocab, {t}, at::TensorOptions().device(dev).dtype(at::kLong));
  auto gOverN = at::full({}, 1.0 / static_cast<double>(t), o.dtype(at::kFloat));
  const double ceMs = kernelMs(
      dev,
      [&] {
        auto part = kernels::crossEntropyPartials(logits, targets, 0);
        kernels::crossEntropyGrad(logits, targets, 0, part[0], part[1], gOverN);
      },
      reps);
  c.elementNs["cross_entropy"] = ceMs * 1e6 / static_cast<double>(logits.numel());
  auto table = at::randn({4 * t, d}, o);
  auto ids = at::randint(4 * t, {t}, at::TensorOptions().device(dev).dtype(at::kLong));
  c.elementNs["embedding"] = perElement(
                                 dev, table, [&](const at::Tensor& v) { return at::embedding(v, ids); }, reps) *
                             static_cast<double>(table.numel()) / static_cast<double>(t * d);
  const int64_t n = gpu ? (int64_t{1} << 28) : (int64_t{1} << 20);
  auto p = at::randn({n}, at::TensorOptions().device(dev).dtype(at::kFloat));
  p.mutable_grad() = at::randn_like(p);
  optim::AdamW adam({p}, {"w"}, {true}, {}, /*multiTensor=*/gpu);
  auto scale = at::ones({1}, p.options());
  c.adamwNsPerParam = kernelMs(
                          dev, [&] { adam.step(scale); }, gpu ? 10 : 2) *
                      1e6 / static_cast<double>(n);
}

}  // namespace tessera::plan
