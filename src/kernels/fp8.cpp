// FP8 casts and GEMM on codes: checks, the CPU reference and the CUDA dispatch (kernels/fp8.h).
#include "kernels/fp8.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/fp8_cuda.h"
#endif

namespace tessera::kernels {
namespace {

using detail::require;

std::atomic<int64_t> gValues{0}, gUnderflows{0}, gSaturated{0};

int64_t amaxCount(fp8::Axis axis, int64_t rows, int64_t cols) {
  return axis == fp8::Axis::Tensor ? 1 : axis == fp8::Axis::Rows ? rows : cols;
}

// max |x| per axis, NaN ignored (fp8/quantize.cpp's fmax), float32 [n].
at::Tensor amaxReference(const at::Tensor& xf, fp8::Axis axis) {
  const int64_t rows = xf.size(0), cols = xf.size(1);
  auto amax = at::zeros({amaxCount(axis, rows, cols)}, at::kFloat);
  const float* in = xf.data_ptr<float>();
  float* a = amax.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = a[axis == fp8::Axis::Tensor ? 0 : axis == fp8::Axis::Rows ? r : c];
      m = std::fmax(m, std::fabs(in[r * cols + c]));
    }
  return amax;
}

#ifdef TESSERA_HAVE_NCCL
// Per device the casts ran on: float32 [2] (underflows, saturated) their kernels add to. Never
// freed (a static tensor's destructor could run after the CUDA context is gone).
std::mutex gCountsMutex;
auto* gDeviceCounts = new std::unordered_map<int, at::Tensor>();

at::Tensor deviceCounts(const at::Device& d) {
  std::lock_guard<std::mutex> lock(gCountsMutex);
  auto& t = (*gDeviceCounts)[d.index()];
  if (!t.defined()) t = at::zeros({2}, at::TensorOptions().dtype(at::kFloat).device(d));
  return t;
}

detail::Fp8Axis axisOf(fp8::Axis a) {
  return a == fp8::Axis::Tensor ? detail::Fp8Axis::Tensor : a == fp8::Axis::Rows ? detail::Fp8Axis::Rows
                                                                                 : detail::Fp8Axis::Cols;
}
#endif

}  // namespace

Fp8Codes fp8Quantize(const at::Tensor& x, fp8::Format f, fp8::Axis axis, const Fp8QuantizeOptions& opts) {
  const char* op = "kernels::fp8Quantize";
  detail::elemType(op, "x", x);
  require(x.dim() >= 1 && x.numel() > 0, op, "x", "a non-empty tensor of at least one dimension", x);
  const auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const int64_t rows = x2.size(0), cols = x2.size(1), n = amaxCount(axis, rows, cols);
  Fp8Codes q;
  q.format = f;
  q.axis = axis;
  const bool gpu = detail::onCuda(op, x2);
  if (opts.amax.defined()) {
    require(opts.amax.scalar_type() == at::kFloat && opts.amax.numel() == n && opts.amax.device() == x2.device(), op,
            "amax", "float32 with one value per scale, on x's device", opts.amax);
    q.amax = opts.amax;
  } else {
#ifdef TESSERA_HAVE_NCCL
    if (gpu) {
      q.amax = at::empty({n}, x2.options().dtype(at::kFloat));
      detail::checkLaunched(detail::launchFp8Amax(x2.data_ptr(), detail::elemType(op, "x", x2), rows, cols,
                                                  axisOf(axis), q.amax.data_ptr<float>(), detail::launchFor(x2)),
                            op, "fp8 amax", x2);
    }
#endif
    if (!gpu) q.amax = amaxReference(x2.to(at::kFloat).contiguous(), axis);
    if (opts.amaxOver && opts.amaxOver->size() > 1) opts.amaxOver->allReduce(q.amax, ReduceOp::Max)->wait();
  }
  gValues += rows * cols;
  const auto byte = x2.options().dtype(at::kByte);
  if (gpu) {
#ifdef TESSERA_HAVE_NCCL
    q.scaleInv = at::empty({n}, x2.options().dtype(at::kFloat));
    if (opts.codes) q.codes = at::empty({rows, cols}, byte);
    if (opts.transposed) q.codesT = at::empty({cols, rows}, byte);
    detail::Fp8CastArgs a{};
    a.x = x2.data_ptr();
    a.type = detail::elemType(op, "x", x2);
    a.rows = rows;
    a.cols = cols;
    a.e5m2 = f == fp8::Format::E5M2;
    a.axis = axisOf(axis);
    a.amax = q.amax.data_ptr<float>();
    a.codes = opts.codes ? q.codes.data_ptr<uint8_t>() : nullptr;
    a.codesT = opts.transposed ? q.codesT.data_ptr<uint8_t>() : nullptr;
    a.scaleInv = q.scaleInv.data_ptr<float>();
    a.counts = deviceCounts(x2.device()).data_ptr<float>();
    detail::checkLaunched(detail::launchFp8Cast(a, detail::launchFor(x2)), op, "fp8 castKernel", x2);
#endif
    return q;
  }
  const auto xf = x2.to(at::kFloat).contiguous();
  const auto amax = q.amax.contiguous();
  std::vector<float> scale(static_cast<size_t>(n));
  q.scaleInv = at::empty({n}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) {
    scale[i] = fp8::scaleFor(amax.data_ptr<float>()[i], f);
    q.scaleInv.data_ptr<float>()[i] = 1.0f / scale[i];
  }
  auto codes = at::empty({rows, cols}, at::kByte);
  fp8::Counts counts;
  const float* in = xf.data_ptr<float>();
  uint8_t* out = codes.data_ptr<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scale[axis == fp8::Axis::Tensor ? 0 : axis == fp8::Axis::Rows ? r : c];
      out[r * cols + c] = fp8::castCounted(in[r * cols + c], s, f, counts);
    }
  gUnderflows += counts.underflows;
  gSaturated += counts.saturated;
  if (opts.codes) q.codes = codes;
  if (opts.transposed) q.codesT = codes.t().contiguous();
  return q;
}

at::Tensor fp8Gemm(const at::Tensor& a, const at::Tensor& aScaleInv, fp8::Format af, const at::Tensor& b,
                   const at::Tensor& bScaleInv, fp8::Format bf, at::ScalarType outDtype, const Fp8GemmOptions& opts) {
  const char* op = "kernels::fp8Gemm";
  require(a.defined() && a.scalar_type() == at::kByte && a.dim() == 2 && a.is_contiguous(), op, "a",
          "contiguous uint8 FP8 codes [m, k]", a);
  require(b.defined() && b.scalar_type() == at::kByte && b.dim() == 2 && b.is_contiguous() && b.size(1) == a.size(1) &&
              b.device() == a.device(),
          op, "b", "contiguous uint8 FP8 codes [n, k] on a's device, k as a's", b);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  const bool outer = aScaleInv.defined() && aScaleInv.numel() != 1;
  require(aScaleInv.defined() && aScaleInv.scalar_type() == at::kFloat && aScaleInv.is_contiguous() &&
              aScaleInv.device() == a.device() && aScaleInv.numel() == (outer ? m : 1),
          op, "aScaleInv", "float32 [1] or [m] on a's device", aScaleInv);
  require(bScaleInv.defined() && bScaleInv.scalar_type() == at::kFloat && bScaleInv.is_contiguous() &&
              bScaleInv.device() == a.device() && bScaleInv.numel() == (outer ? n : 1),
          op, "bScaleInv", "float32 [1], or [n] when a's scales are per row, on a's device", bScaleInv);
  TESSERA_CHECK(!(af == fp8::Format::E5M2 && bf == fp8::Format::E5M2),
                "{}: E5M2 × E5M2 has no cuBLASLt kernel (a [{}, {}], b [{}, {}])", op, m, k, n, k);
  TESSERA_CHECK(outDtype == at::kFloat || outDtype == at::kBFloat16 || outDtype == at::kHalf,
                "{}: output dtype {} (float32, bfloat16 or float16)", op, c10::toString(outDtype));
  if (opts.accumulate.defined())
    require(opts.accumulate.scalar_type() == at::kFloat && opts.accumulate.is_contiguous() &&
                opts.accumulate.sizes() == at::IntArrayRef({m, n}) && opts.accumulate.device() == a.device(),
            op, "accumulate", "a contiguous float32 [m, n] on a's device", opts.accumulate);
  if (!detail::onCuda(op, a)) {
    auto decoded = [](const at::Tensor& codes, fp8::Format f, const at::Tensor& inv) {
      auto lut = at::empty({256}, at::kFloat);
      for (int i = 0; i < 256; ++i) lut.data_ptr<float>()[i] = fp8::decode(static_cast<uint8_t>(i), f);
      auto v = lut.index_select(0, codes.reshape({-1}).to(at::kLong)).view(codes.sizes());
      return v * (inv.numel() == 1 ? inv : inv.view({-1, 1}));
    };
    auto prod = at::mm(decoded(a, af, aScaleInv), decoded(b, bf, bScaleInv).t());
    if (opts.accumulate.defined()) return opts.overwrite ? opts.accumulate.copy_(prod) : opts.accumulate.add_(prod);
    return prod.to(outDtype);
  }
#ifdef TESSERA_HAVE_NCCL
  TESSERA_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0,
                "{}: cuBLASLt's FP8 GEMM needs every dimension a multiple of 16; got a [{}, {}] · b [{}, {}]ᵀ (on {}): "
                "pad the batch or sequence, or leave this layer out of FP8",
                op, m, k, n, k, a.device().str());
  auto out = opts.accumulate.defined() ? opts.accumulate : at::empty({m, n}, a.options().dtype(outDtype));
  constexpr size_t kWorkspace = 32u << 20;
  auto ws = at::empty({static_cast<int64_t>(kWorkspace)}, a.options());
  detail::Fp8GemmArgs g{};
  g.a = a.data_ptr<uint8_t>();
  g.b = b.data_ptr<uint8_t>();
  g.aE5M2 = af == fp8::Format::E5M2;
  g.bE5M2 = bf == fp8::Format::E5M2;
  g.aScale = aScaleInv.data_ptr<float>();
  g.bScale = bScaleInv.data_ptr<float>();
  g.outerScales = outer;
  g.d = out.data_ptr();
  g.dType = detail::elemType(op, "out", out);
  g.m = m, g.n = n, g.k = k, g.ldd = n;
  g.accumulate = opts.accumulate.defined() && !opts.overwrite;
  g.fastAccum = opts.fastAccum;
  g.workspace = ws.data_ptr();
  g.workspaceBytes = kWorkspace;
  detail::checkLaunched(detail::launchFp8Gemm(g, detail::launchFor(a)), op, "cublasLtMatmul (FP8)", a);
  return out;
#else
  return at::Tensor();
#endif
}

#ifdef TESSERA_HAVE_NCCL
namespace {
// Device `index`'s kernel counts as int64 [2] (underflows, saturated) on it, zeroed after the read
// in stream order; undefined when no cast ran there.
at::Tensor takeDeviceCounts(int index) {
  at::Tensor t;
  {
    std::lock_guard<std::mutex> lock(gCountsMutex);
    auto it = gDeviceCounts->find(index);
    if (it != gDeviceCounts->end()) t = it->second;
  }
  if (!t.defined()) return t;
  auto n = t.to(at::kLong);
  t.zero_();
  return n;
}
}  // namespace
#endif

fp8::Counts takeFp8Counts() {
  fp8::Counts c{gValues.exchange(0), gUnderflows.exchange(0), gSaturated.exchange(0)};
#ifdef TESSERA_HAVE_NCCL
  std::vector<int> devices;
  {
    std::lock_guard<std::mutex> lock(gCountsMutex);
    for (const auto& [i, t] : *gDeviceCounts) devices.push_back(i);
  }
  for (const int i : devices) {
    const auto host = takeDeviceCounts(i).cpu();  // synchronises with the casts queued before
    c.underflows += host.data_ptr<int64_t>()[0];
    c.saturated += host.data_ptr<int64_t>()[1];
  }
#endif
  return c;
}

at::Tensor takeFp8CountsOn(const at::Device& device, fp8::Counts extra) {
  const int64_t host[3] = {gValues.exchange(0) + extra.values, gUnderflows.exchange(0) + extra.underflows,
                           gSaturated.exchange(0) + extra.saturated};
  if (!device.is_cuda()) return at::tensor({host[0], host[1], host[2]}, at::kLong);
  auto out = at::zeros({3}, at::TensorOptions().dtype(at::kLong).device(device));
  for (int i = 0; i < 3; ++i) out.select(0, i).fill_(host[i]);  // a fill from a host scalar: no copy, no sync
#ifdef TESSERA_HAVE_NCCL
  if (auto n = takeDeviceCounts(device.index()); n.defined()) out.narrow(0, 1, 2).add_(n);
#endif
  return out;
}

}  // namespace tessera::kernels
