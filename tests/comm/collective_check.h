#pragma once
// Hand-computed expectations for the collective tests (shared by the Gloo suite and the
// NCCL GPU suite). Rank r's input element i is (r + 1) * (i % 5 + 1): small integers, so
// every dtype (fp16/bf16 included) represents inputs and sums exactly.
#include <ATen/ATen.h>

#include <sstream>
#include <string>
#include <vector>

namespace tessera::testing {

inline double inputValue(int rank, int64_t i) { return (rank + 1) * (i % 5 + 1); }

inline at::Tensor rankInput(int rank, int64_t n, c10::ScalarType dt, int64_t offset = 0) {
  auto idx = at::arange(offset, offset + n, at::kDouble);
  return (idx.remainder(5).add(1)).mul(rank + 1).to(dt);
}

inline bool isIntegral(c10::ScalarType dt) { return dt == at::kInt || dt == at::kLong; }

// The reference answer as float64 for `op` over ranks 0..n-1 of element i.
inline double reduceExpect(const std::string& op, int n, int64_t i, bool integral) {
  double s = 0, mx = -1e30, mn = 1e30;
  for (int r = 0; r < n; ++r) {
    double v = inputValue(r, i);
    s += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  if (op == "sum") return s;
  if (op == "max") return mx;
  if (op == "min") return mn;
  return integral ? std::trunc(s / n) : s / n;  // avg
}

inline const std::vector<c10::ScalarType>& allDtypes() {
  static const std::vector<c10::ScalarType> d = {at::kFloat, at::kBFloat16, at::kHalf, at::kInt, at::kLong};
  return d;
}

inline const std::vector<int64_t>& oddSizes() {
  static const std::vector<int64_t> s = {1, 7, 1031};
  return s;
}

// Max |got - want| over the tensor (both compared as float64 on the CPU).
inline double maxAbsDiff(const at::Tensor& got, const at::Tensor& want) {
  return (got.cpu().to(at::kDouble) - want.cpu().to(at::kDouble)).abs().max().item<double>();
}

// A tensor as text for failure messages (fmt cannot format at::Tensor).
inline std::string str(const at::Tensor& t) {
  std::ostringstream ss;
  ss << t;
  return ss.str();
}

}  // namespace tessera::testing
