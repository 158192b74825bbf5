// Scaled FP8 casts, CPU reference (contract in quantize.h).
#include "tessera/fp8/quantize.h"

#include <ATen/ATen.h>

#include <cmath>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"

namespace tessera::fp8 {

const char* name(Scaling s) { return s == Scaling::Tensorwise ? "tensorwise" : "rowwise"; }

float scaleFor(float amax, Format f) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  return maxFinite(f) / amax;  // float32 division, as the kernels
}

uint8_t castCounted(float x, float scale, Format f, Counts& c) {
  const float scaled = x * scale, top = maxFinite(f);
  const uint8_t code = encode(scaled, f, Overflow::Saturate);
  ++c.values;
  if (std::isfinite(x) && x != 0 && (code & 0x7f) == 0) ++c.underflows;
  if (std::isfinite(scaled) && std::fabs(scaled) > top && !(std::fabs(round(scaled, f, Overflow::NoSaturate)) <= top))
    ++c.saturated;
  return code;
}

namespace {

// Codes of rows of `x` ([rows, cols] float32, contiguous) with per-row scales (`perRow`) or one.
void castRows(const at::Tensor& x, Format f, bool perRow, at::Tensor& codes, at::Tensor& scaleInv, Counts& counts) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const float* in = x.data_ptr<float>();
  codes = at::empty({rows, cols}, at::kByte);
  scaleInv = perRow ? at::empty({rows, 1}, at::kFloat) : at::empty({1}, at::kFloat);
  uint8_t* out = codes.data_ptr<uint8_t>();
  float* inv = scaleInv.data_ptr<float>();
  float amaxAll = 0;
  if (!perRow) {
    for (int64_t i = 0; i < rows * cols; ++i) amaxAll = std::fmax(amaxAll, std::fabs(in[i]));
  }
  for (int64_t r = 0; r < rows; ++r) {
    float amax = amaxAll;
    if (perRow) {
      amax = 0;
      for (int64_t c = 0; c < cols; ++c) amax = std::fmax(amax, std::fabs(in[r * cols + c]));
    }
    const float scale = scaleFor(amax, f);
    if (perRow || r == 0) inv[perRow ? r : 0] = 1.0f / scale;
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = castCounted(in[r * cols + c], scale, f, counts);
  }
}

}  // namespace

Quantized quantizeReference(const at::Tensor& x, Format f, Scaling s, bool transposed) {
  TESSERA_CHECK(x.defined() && x.dim() == 2 && x.device().is_cpu() &&
                    (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
                "fp8::quantizeReference: needs a 2-D float32/bfloat16/float16 CPU tensor, got {}",
                x.defined() ? fmt::format("{} {} on {}", c10::str(x.sizes()), dtypeName(x.scalar_type()), x.device().str())
                            : std::string("an undefined tensor"));
  Quantized q;
  q.format = f;
  q.scaling = s;
  const auto xf = x.to(at::kFloat).contiguous();
  Counts counts;
  const bool perRow = s == Scaling::Rowwise;
  castRows(xf, f, perRow, q.codes, q.scaleInv, counts);
  if (transposed) castRows(xf.t().contiguous(), f, perRow, q.codesT, q.scaleInvT, counts);
  q.underflows = at::full({1}, static_cast<double>(counts.underflows), at::kFloat);
  q.saturated = at::full({1}, static_cast<double>(counts.saturated), at::kFloat);
  return q;
}

at::Tensor dequantizeReference(const Quantized& q, bool transposed) {
  const auto& codes = transposed ? q.codesT : q.codes;
  const auto& inv = transposed ? q.scaleInvT : q.scaleInv;
  TESSERA_CHECK(codes.defined(), "fp8::dequantizeReference: no {}codes", transposed ? "transposed " : "");
  auto out = at::empty(codes.sizes(), at::kFloat);
  const uint8_t* in = codes.contiguous().data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const int64_t rows = codes.size(0), cols = codes.size(1);
  const float* s = inv.data_ptr<float>();
  const bool perRow = q.scaling == Scaling::Rowwise;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = decode(in[r * cols + c], q.format) * s[perRow ? r : 0];
  return out;
}

}  // namespace tessera::fp8
