// FP8 fake quantization for the CPU emulation (contract in fake_quant.h).
#include "fp8/fake_quant.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>

#include "comm/types.h"
#include "common/choice.h"
#include "common/error.h"

namespace tessera::fp8 {

namespace {
std::atomic<int64_t> gValues{0}, gUnderflows{0}, gSaturated{0};
constexpr Choices<Recipe, 3> kRecipes{
    "fp8 recipe", {{{Recipe::Off, "off"}, {Recipe::Tensorwise, "tensorwise"}, {Recipe::Rowwise, "rowwise"}}}};
}  // namespace

const char* name(Recipe r) { return kRecipes.name(r); }

Counts takeCounts() { return {gValues.exchange(0), gUnderflows.exchange(0), gSaturated.exchange(0)}; }
Recipe parseRecipe(const std::string& s) { return kRecipes.parse(s); }

at::Tensor fakeQuantize(const at::Tensor& t, Format f, Axis axis, const CommPtr& amaxOver) {
  TESSERA_CHECK(t.defined() && t.dim() >= 1 &&
                    (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf),
                "fp8::fakeQuantize: needs a float32/bfloat16/float16 tensor, got {}",
                t.defined() ? fmt::format("{} {}", c10::str(t.sizes()), dtypeName(t.scalar_type())) : "an undefined one");
  TESSERA_CHECK(t.device().is_cpu(),
                "fp8::fakeQuantize: the FP8 emulation runs on CPU tensors; got one on {} (FP8 on GPUs is cuBLASLt's "
                "scaled GEMM on the codes)",
                t.device().str());
  const auto x = t.detach().reshape({-1, t.size(-1)}).to(at::kFloat).contiguous();
  at::Tensor amax = axis == Axis::Tensor ? x.abs().amax().reshape({1})
                    : axis == Axis::Rows ? x.abs().amax({1}, /*keepdim=*/true)
                                         : x.abs().amax({0}, /*keepdim=*/true);
  if (amaxOver && amaxOver->size() > 1) amaxOver->allReduce(amax, ReduceOp::Max)->wait();
  // scale = max / amax in float32; 1 where amax is 0 or not finite (fp8/quantize.h).
  const auto usable = at::logical_and(amax > 0, at::isfinite(amax));
  const auto scale = at::where(usable, at::full({1}, maxFinite(f), at::kFloat) / amax, at::ones_like(amax));
  const auto inv = at::ones_like(scale) / scale;
  auto scaled = (x * scale).contiguous();
  float* p = scaled.data_ptr<float>();
  const float top = maxFinite(f);
  int64_t under = 0, sat = 0;
  const int64_t n = scaled.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = p[i];
    p[i] = round(v, f, Overflow::Saturate);
    if (std::isfinite(v) && v != 0 && p[i] == 0) ++under;
    if (std::fabs(v) > top && std::isfinite(v) && !(std::fabs(round(v, f, Overflow::NoSaturate)) <= top)) ++sat;
  }
  gValues += n;
  gUnderflows += under;
  gSaturated += sat;
  return (scaled * inv).to(t.scalar_type()).view(t.sizes());
}

}  // namespace tessera::fp8
