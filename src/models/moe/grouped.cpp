#include "models/moe/grouped.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <mutex>
#include <numeric>
#include <set>
#include <string>

#include "common/compat.h"
#include "common/env.h"
#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

#ifdef TESSERA_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace tessera::models::moe_detail {
namespace {

constexpr const char* kVariable = "TESSERA_MOE_GROUPED_GEMM";

// One log line per process and message: which way a CUDA run's expert GEMMs go.
void sayOnce(const std::string& msg) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(msg).second) log::info("moe experts: {}", msg);
}

int computeCapability(const at::Device& d) {  // major * 10 + minor; 0 without a CUDA LibTorch
#ifdef TESSERA_TORCH_CUDA
  const auto* p = at::cuda::getDeviceProperties(d.has_index() ? d.index() : at::cuda::current_device());
  return p->major * 10 + p->minor;
#else
  (void)d;
  return 0;
#endif
}

// Why grouped GEMMs cannot run on these operands (as they reach the GEMMs); empty when they can.
std::string blocker(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2) {
  if (!compat::kHaveGroupedMm) return "this LibTorch has no at::_grouped_mm (2.8+)";
  if (!x.is_cuda()) return fmt::format("rows on {}, not a CUDA device", x.device().str());
  if (const int cc = computeCapability(x.device()); cc < 90) {
    return fmt::format("compute capability {}.{} (the grouped GEMM kernel needs 9.0+)", cc / 10, cc % 10);
  }
  for (const auto* t : {&x, &w1, &w3, &w2}) {
    if (t->scalar_type() != at::kBFloat16) {
      return fmt::format("rows {}, w1 {}, w3 {}, w2 {} (bfloat16 needed: bf16 weights or CUDA autocast to bf16)",
                         c10::toString(x.scalar_type()), c10::toString(w1.scalar_type()),
                         c10::toString(w3.scalar_type()), c10::toString(w2.scalar_type()));
    }
  }
  if (x.size(1) % 8 != 0 || w1.size(1) % 8 != 0) {
    return fmt::format("d {} and f {} (both must be multiples of 8: 16-byte rows)", x.size(1), w1.size(1));
  }
  for (const auto* t : {&x, &w1, &w3, &w2}) {
    if (reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) return "an operand not 16-byte aligned";
  }
  return {};
}

// The per-expert loop (experts without rows skipped).
at::Tensor loop(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& w1, const at::Tensor& w3,
                const at::Tensor& w2) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  TESSERA_CHECK(total == rows.size(0), "moe experts: counts [{}] add up to {} rows, but the rows are [{}]",
                fmt::join(counts, ", "), total, fmt::join(rows.sizes(), ", "));
  std::vector<at::Tensor> out;
  int64_t at0 = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    auto x = rows.narrow(0, at0, counts[e]);
    const auto i = static_cast<int64_t>(e);
    out.push_back(at::linear(at::silu(at::linear(x, w1[i])) * at::linear(x, w3[i]), w2[i]));
    at0 += counts[e];
  }
  // No rows at all: an empty output that still depends on the weights (their gradients zero, not absent)
  // and on the rows, so that backward still runs the exchange that brought them (expert parallel: the
  // ranks that sent rows here wait for their gradients, if zero of them).
  if (out.empty()) return rows.new_zeros({0, w2.size(1)}) + (rows.sum() + w1.sum() + w3.sum() + w2.sum()) * 0;
  return at::cat(out);
}

// Why the FP8 forward GEMMs cannot run on operands the bf16 grouped GEMMs take; empty when they can.
std::string fp8Blocker(const at::Tensor& x, const at::Tensor& w1) {
  if (!compat::kHaveScaledGroupedMm) return "this LibTorch has no at::_scaled_grouped_mm (2.8+)";
  if (x.size(1) % 16 != 0 || w1.size(1) % 16 != 0) {
    return fmt::format("d {} and f {} (both must be multiples of 16 for FP8 rows)", x.size(1), w1.size(1));
  }
  return {};
}

// Three grouped GEMMs over every expert; the weights as [El, in, out] views of [El, out, in].
at::Tensor grouped(const at::Tensor& x, const at::Tensor& counts, const at::Tensor& w1, const at::Tensor& w3,
                   const at::Tensor& w2, const ExpertFp8& fp8) {
  auto offs = at::cumsum(counts.to(x.device()), 0, at::kInt);  // the groups' row ends, on the device
  if (fp8.on) {
    auto h1 = fp8GroupedLinear(x, w1, offs, fp8.key1), h3 = fp8GroupedLinear(x, w3, offs, fp8.key3);
    return fp8GroupedLinear(at::silu(h1) * h3, w2, offs, fp8.key2);
  }
  auto h1 = compat::groupedMm(x, w1.transpose(1, 2), offs);
  auto h3 = compat::groupedMm(x, w3.transpose(1, 2), offs);
  return compat::groupedMm(at::silu(h1) * h3, w2.transpose(1, 2), offs);
}

bool loopAsked() {
  auto v = env::get(kVariable);
  if (!v) return false;
  TESSERA_CHECK(*v == "0" || *v == "1",
                "environment variable {}='{}': 0 (the per-expert loop) or 1 (grouped GEMMs where they can run, the "
                "default)",
                kVariable, *v);
  return *v == "0";
}

}  // namespace

std::vector<int64_t> hostCounts(const at::Tensor& t) {
  auto c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

at::Tensor runExperts(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& w1, const at::Tensor& w3,
                      const at::Tensor& w2, ExpertGemm how, const ExpertFp8& fp8) {
  TESSERA_CHECK(rows.dim() == 2 && w1.dim() == 3 && w1.sizes() == w3.sizes() && w2.dim() == 3 &&
                    w2.size(0) == w1.size(0) && w1.size(2) == rows.size(1) && w2.size(1) == rows.size(1) &&
                    w2.size(2) == w1.size(1) && counts.dim() == 1 && counts.size(0) == w1.size(0),
                "moe experts: rows [{}], counts [{}], w1 [{}], w3 [{}], w2 [{}] do not fit ([M, d], [El], [El, f, d], "
                "[El, f, d], [El, d, f])",
                fmt::join(rows.sizes(), ", "), fmt::join(counts.sizes(), ", "), fmt::join(w1.sizes(), ", "),
                fmt::join(w3.sizes(), ", "), fmt::join(w2.sizes(), ", "));
  if (how == ExpertGemm::Auto && loopAsked()) {
    if (rows.is_cuda()) sayOnce(fmt::format("a loop of per-expert GEMMs ({}=0)", kVariable));
    how = ExpertGemm::Loop;
  }
  // No rows: the loop's empty output (no GEMM of zero rows).
  if (how != ExpertGemm::Loop && rows.size(0) > 0 && (rows.is_cuda() || how == ExpertGemm::Grouped)) {
    // The operands as at::linear under CUDA autocast would get them (the weights through autocast's cache).
    auto x = castForCudaAutocast(rows);
    auto a = castParamForCudaAutocast(w1).contiguous(), b = castParamForCudaAutocast(w3).contiguous(),
         c = castParamForCudaAutocast(w2).contiguous();
    const auto why = blocker(x, a, b, c);
    if (why.empty()) {
      sayOnce("grouped GEMMs (at::_grouped_mm; no host read of the counts)");
      ExpertFp8 use = fp8;
      if (fp8.on) {
        const auto no = fp8Blocker(x, a);
        sayOnce(no.empty() ? "forward GEMMs in FP8 (at::_scaled_grouped_mm, E4M3, rowwise scales)"
                           : fmt::format("forward GEMMs in bf16, not FP8: {}", no));
        use.on = no.empty();
      }
      return grouped(x, counts, a, b, c, use);
    }
    TESSERA_CHECK(how != ExpertGemm::Grouped, "moe experts: grouped GEMMs asked for on rows [{}], but {}",
                  fmt::join(rows.sizes(), ", "), why);
    sayOnce(fmt::format("a loop of per-expert GEMMs: {}", why));
  }
  if (fp8.on && rows.is_cuda())
    sayOnce("the per-expert loop runs in bf16, not FP8 (FP8 experts need the grouped kernel)");
  return loop(rows, hostCounts(counts), w1, w3, w2);
}

at::Tensor runExperts(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& w1,
                      const at::Tensor& w3, const at::Tensor& w2, ExpertGemm how, const ExpertFp8& fp8) {
  return runExperts(rows, at::tensor(counts, at::kLong), w1, w3, w2, how, fp8);
}

}  // namespace tessera::models::moe_detail
