#pragma once
// Helpers shared by the bucket-copy tests (CPU and GPU): random layouts, bit views, and the
// naive per-element answer (double math, one rounding to fp32, then to the target dtype).
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tessera::testing {

inline const std::vector<at::ScalarType>& bucketDtypes() {
  static const std::vector<at::ScalarType> d = {at::kFloat, at::kBFloat16, at::kHalf};
  return d;
}

// Element i of a contiguous CPU fp32/bf16/fp16 tensor, exactly, as a double.
inline double readAt(const at::Tensor& t, int64_t i) {
  switch (t.scalar_type()) {
    case at::kFloat: return t.data_ptr<float>()[i];
    case at::kBFloat16: return static_cast<float>(t.data_ptr<c10::BFloat16>()[i]);
    default: return static_cast<float>(t.data_ptr<c10::Half>()[i]);
  }
}

// Stores v (an fp32 value) rounded to nearest even into element i.
inline void writeAt(const at::Tensor& t, int64_t i, float v) {
  switch (t.scalar_type()) {
    case at::kFloat: t.data_ptr<float>()[i] = v; break;
    case at::kBFloat16: t.data_ptr<c10::BFloat16>()[i] = c10::BFloat16(v); break;
    default: t.data_ptr<c10::Half>()[i] = c10::Half(v); break;
  }
}

// The value the contract asks for: x * float(scale) computed exactly in double, rounded once
// to fp32 (what an fp32 multiply gives), no multiply at all when float(scale) == 1.
inline float naiveScaled(double x, double scale) {
  const auto fscale = static_cast<float>(scale);
  return fscale == 1.0f ? static_cast<float>(x) : static_cast<float>(x * static_cast<double>(fscale));
}

// Same-width integer view of a tensor's bits (for bitwise comparisons that NaNs do not spoil).
inline at::Tensor bits(const at::Tensor& t) {
  return t.contiguous().view(t.element_size() == 4 ? at::kInt : at::kShort);
}

// Largest distance in units of the last place between two same-dtype tensors (sign-magnitude
// bits mapped to a monotonic integer line; +0 and -0 are one apart).
inline int64_t maxUlpDiff(const at::Tensor& a, const at::Tensor& b) {
  auto ia = bits(a.cpu()).reshape(-1).to(at::kLong), ib = bits(b.cpu()).reshape(-1).to(at::kLong);
  const int64_t signBit = a.element_size() == 4 ? (int64_t{1} << 31) : (int64_t{1} << 15);
  auto ordered = [&](const at::Tensor& x) {
    auto u = at::where(x < 0, x + 2 * signBit, x);  // as unsigned
    return at::where(u >= signBit, signBit - 1 - u, u);
  };
  return a.numel() == 0 ? 0 : (ordered(ia) - ordered(ib)).abs().max().item<int64_t>();
}

// A bucket layout: tensors of the given sizes (some 2-D), placed in order with random gaps of
// 0..maxGap elements (so offsets are often misaligned); returns the bucket numel.
struct Layout {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
};

inline Layout makeLayout(const std::vector<int64_t>& sizes, const std::vector<at::ScalarType>& dtypes,
                         at::Device device, std::mt19937& rng, int maxGap = 3) {
  Layout l;
  std::uniform_int_distribution<int> gap(0, maxGap);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    l.numel += gap(rng);
    l.offsets.push_back(l.numel);
    auto t = (n >= 2 && n % 2 == 0) ? at::randn({2, n / 2}) : at::randn({n});
    l.tensors.push_back(t.to(dtypes[i % dtypes.size()]).to(device));
    l.numel += n;
  }
  l.numel += gap(rng);
  return l;
}

}  // namespace tessera::testing
