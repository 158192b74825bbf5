// Measuring a card's calibration with the runtime's own ops (contract in plan/measure.h).
#include "tessera/plan/measure.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <set>
#include <tuple>

#include "kernels/fp8.h"
#include "kernels/gemm_accumulate.h"
#include "comm/fake/fake_communicator.h"
#include "tessera/common/attention.h"
#include "tessera/parallel/context/attention.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "plan/shapes.h"

namespace tessera::plan {

kernels::Fp8QuantizeOptions transposedCodes();  // x's codes and their transpose

namespace {

at::Device measureDevice() { return torch::cuda::is_available() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

// Mean milliseconds of f after two warm-ups, repeated until ~40 ms (at least 3 runs), the device
// synchronised around the timed runs.
double timeMs(const at::Device& dev, const std::function<void()>& f) {
  using Clock = std::chrono::steady_clock;
  f();
  f();
  synchronizeDevice(dev);
  auto t0 = Clock::now();
  f();
  synchronizeDevice(dev);
  const double first = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const int reps = std::clamp(static_cast<int>(40.0 / std::max(first, 1e-3)), 3, 200);
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  synchronizeDevice(dev);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / reps;
}

at::TensorOptions bf16(const at::Device& d) { return at::TensorOptions().device(d).dtype(at::kBFloat16); }

bool fp8Kernels(const at::Device& d) {
#ifdef TESSERA_HAVE_NCCL
  return d.is_cuda();
#else
  (void)d;
  return false;
#endif
}

// The three GEMMs of a linear with `in` → `out` features over `t` tokens.
void measureLinear(const at::Device& dev, int64_t t, int64_t in, int64_t out, bool fp8, Calibration& c) {
  auto x = at::randn({t, in}, bf16(dev)), w = at::randn({out, in}, bf16(dev)) * 0.02;
  auto dy = at::randn({t, out}, bf16(dev));
  auto acc = at::zeros({out, in}, at::TensorOptions().device(dev).dtype(at::kFloat));
  if (!fp8) {
    c.gemms.push_back({"fwd", t, out, in, false, timeMs(dev, [&] { at::mm(x, w.t()); })});
    c.gemms.push_back({"dgrad", t, in, out, false, timeMs(dev, [&] { at::mm(dy, w); })});
    c.gemms.push_back({"wgrad", out, in, t, false, timeMs(dev, [&] { kernels::gemmAccumulateTN(acc, dy, x); })});
    return;
  }
  using fp8::Axis;
  using fp8::Format;
  auto qx = kernels::fp8Quantize(x, Format::E4M3, Axis::Tensor, transposedCodes());
  auto qw = kernels::fp8Quantize(w, Format::E4M3, Axis::Tensor, transposedCodes());
  auto qd = kernels::fp8Quantize(dy, Format::E4M3, Axis::Tensor, transposedCodes());
  const auto e4 = Format::E4M3;
  kernels::Fp8GemmOptions fast;
  fast.fastAccum = true;
  c.gemms.push_back({"fwd", t, out, in, true, timeMs(dev, [&] {
                       kernels::fp8Gemm(qx.codes, qx.scaleInv, e4, qw.codes, qw.scaleInv, e4, at::kBFloat16, fast);
                     })});
  c.gemms.push_back({"dgrad", t, in, out, true, timeMs(dev, [&] {
                       kernels::fp8Gemm(qd.codes, qd.scaleInv, e4, qw.codesT, qw.scaleInv, e4, at::kBFloat16);
                     })});
  kernels::Fp8GemmOptions into;
  into.accumulate = acc;
  c.gemms.push_back({"wgrad", out, in, t, true, timeMs(dev, [&] {
                       kernels::fp8Gemm(qd.codesT, qd.scaleInv, e4, qx.codesT, qx.scaleInv, e4, at::kFloat, into);
                     })});
}

void measureGemms(const MeasureOptions& o, const at::Device& dev, Calibration& c) {
  std::set<std::tuple<int64_t, int64_t, int64_t, bool>> done;
  const bool withFp8 = o.fp8 && fp8Kernels(dev);
  for (const auto& m : o.models) {
    for (int tp : o.tp) {
      if (!tpFits(m, tp)) continue;
      for (int64_t t : o.tokens) {
        for (const LinearShape& l : linearShapes(m, tp)) {
          for (bool fp8 : {false, true}) {
            if (fp8 && (!withFp8 || !l.block)) continue;
            if (2.0 * t * l.in * l.out / 1e9 > o.maxGemmGflop) continue;
            if (!done.insert({t, l.in, l.out, fp8}).second) continue;
            try {
              measureLinear(dev, t, l.in, l.out, fp8, c);
            } catch (const std::exception& e) {  // a shape a kernel refuses: the others still count
              if (o.progress)
                o.progress(fmt::format("skipped {} [{} x {}] over {} tokens: {}", l.name, l.in, l.out, t, e.what()));
            }
          }
        }
      }
      if (o.progress)
        o.progress(fmt::format("GEMMs of {} at tp {}: {} samples so far", m.describe(), tp, c.gemms.size()));
    }
  }
}

// Forward and backward milliseconds of attn(q, k, v) on random bf16 q of `qShape` and k, v of `kvShape`:
// the forward timed without autograd, the backward as forward + backward (from a random gradient)
// less the forward.
std::pair<double, double> timeAttention(
    const at::Device& dev, at::IntArrayRef qShape, at::IntArrayRef kvShape,
    const std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>& attn) {
  auto q = at::randn(qShape, bf16(dev)).requires_grad_(true);
  auto k = at::randn(kvShape, bf16(dev)).requires_grad_(true);
  auto v = at::randn(kvShape, bf16(dev)).requires_grad_(true);
  auto g = at::randn(qShape, bf16(dev));
  const double f = timeMs(dev, [&] {
    at::NoGradGuard ng;
    attn(q, k, v);
  });
  const double fb = timeMs(dev, [&] { attn(q, k, v).backward(g); });
  return {f, std::max(fb - f, 0.0)};
}

// Context parallel's attention as rank 0 of a group of `cp` plays it: its two query chunks of s/(2 cp)
// positions against the gathered keys up to theirs, through the kernel it picks (sequence-first [s/cp,
// b, heads, hd] as the Llama hands them over). The communicator moves no data (comm/fake: the gather
// repeats this rank's keys), so the time is the rank's compute and reordering, not the transfer.
void measureCpAttention(const at::Device& dev, int64_t b, int64_t h, int64_t kv, int64_t s, int64_t hd, int cp,
                        Calibration& c) {
  const CommPtr group = makeFakeCommunicator(0, cp, dev, "plan-cp");
  const int64_t local = s / cp;
  const auto [f, bwd] = timeAttention(dev, {local, b, h, hd}, {local, b, kv, hd},
                                      [&](auto& q, auto& k, auto& v) { return cp::attention(q, k, v, group); });
  AttentionSample a{b, h, kv, s, hd, f, bwd};
  a.cp = cp;
  c.cpAttention.push_back(a);
}

void measureAttention(const MeasureOptions& o, const at::Device& dev, Calibration& c) {
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> done;
  for (const auto& m : o.models) {
    for (int tp : o.tp) {
      if (!tpFits(m, tp)) continue;
      const int64_t h = m.heads / tp, kv = std::max<int64_t>(1, m.kvH() / tp), hd = m.headDim();
      for (int64_t s : o.seqs) {
        if (!done.insert({h, kv, hd, s}).second) continue;
        // Enough sequences for 16k tokens: a short sequence alone measures launch latency, not work.
        const int64_t b = std::max<int64_t>(1, 16384 / s);
        const auto [f, bwd] = timeAttention(dev, {b, h, s, hd}, {b, kv, s, hd},
                                            [](auto& q, auto& k, auto& v) { return causalSelfAttention(q, k, v); });
        c.attention.push_back({b, h, kv, s, hd, f, bwd});
        if (dev.is_cuda()) measureCpAttention(dev, b, h, kv, s, hd, 1, c);
      }
    }
  }
  // Context parallel at its own layouts (tp 1): a rank's two chunks at the whole sequence's length.
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int>> cpDone;
  for (const auto& m : o.models) {
    const int64_t h = m.heads, kv = m.kvH(), hd = m.headDim();
    for (int cp : o.cp) {
      for (int64_t s : o.cpSeqs) {
        if (!dev.is_cuda() || s % (2 * cp) != 0 || !cpDone.insert({h, kv, hd, s, cp}).second) continue;
        measureCpAttention(dev, std::max<int64_t>(1, 16384 * cp / s), h, kv, s, hd, cp, c);
      }
    }
  }
  if (o.progress) {
    o.progress(fmt::format("attention: {} samples, context parallel's: {}", c.attention.size(), c.cpAttention.size()));
  }
}

}  // namespace

void measureElementwise(const at::Device& dev, Calibration& c);  // measure_kernels.cpp

kernels::Fp8QuantizeOptions transposedCodes() {
  kernels::Fp8QuantizeOptions q;
  q.transposed = true;
  return q;
}

Calibration measureCalibration(const MeasureOptions& o) {
  TESSERA_CHECK(!o.models.empty(), "measureCalibration: no model to measure the shapes of");
  const at::Device dev = measureDevice();
  useDevice(dev);
  Calibration c;
  c.card = deviceName(dev);
  c.memoryGiB = totalMemoryGiB(dev);
  c.source = "measureCalibration on " + dev.str();
  if (!dev.is_cuda()) c.peakTflopsBf16 = c.peakTflopsFp8 = 1;  // no meaningful MFU on a CPU
  measureGemms(o, dev, c);
  measureAttention(o, dev, c);
  measureElementwise(dev, c);
  if (o.progress) o.progress("elementwise kernels and AdamW measured");
  return c;
}

}  // namespace tessera::plan
