// FP8 fake quantization for the CPU emulation (contract in fake_quant.h).
#include "tessera/fp8/fake_quant.h"

#include <ATen/ATen.h>

#include <atomic>

#include "tessera/comm/types.h"
#include "common/choice.h"
#include "tessera/common/error.h"

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
  // One scale per amax (fp8/quantize.h's rule), broadcast over the values it scales.
  auto scales = amax.contiguous().clone();
  for (float* a = scales.data_ptr<float>(), *end = a + scales.numel(); a != end; ++a) *a = scaleFor(*a, f);
  const auto scale = scales.expand_as(x).contiguous();
  auto out = at::empty_like(x);
  const float *in = x.data_ptr<float>(), *sc = scale.data_ptr<float>();
  float* o = out.data_ptr<float>();
  Counts c;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) o[i] = decode(castCounted(in[i], sc[i], f, c), f) * (1.0f / sc[i]);
  gValues += c.values;
  gUnderflows += c.underflows;
  gSaturated += c.saturated;
  return out.to(t.scalar_type()).view(t.sizes());
}

}  // namespace tessera::fp8
