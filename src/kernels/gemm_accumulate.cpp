#include "kernels/gemm_accumulate.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"

#ifdef TESSERA_HAVE_NCCL
#include "comm/nccl/cuda_stream.h"
#include "kernels/gemm_accumulate_cuda.h"
#endif

namespace tessera::kernels {
namespace {

std::string describeOperand(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} {} on {}{}", c10::str(t.sizes()), dtypeName(t.scalar_type()), t.device().str(),
                     t.is_contiguous() ? "" : " (not contiguous)");
}

void check(const char* fn, const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  const bool shapes = acc.defined() && a.defined() && b.defined() && acc.dim() == 2 && a.dim() == 2 && b.dim() == 2 &&
                      a.size(0) == b.size(0) && acc.size(0) == a.size(1) && acc.size(1) == b.size(1);
  const bool types = shapes && acc.scalar_type() == at::kFloat && a.scalar_type() == b.scalar_type() &&
                     (a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf);
  const bool layout = types && acc.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
                      acc.device() == a.device() && a.device() == b.device();
  TESSERA_CHECK(layout,
                "{}: needs acc float32 [m, n] += a[k, m]ᵀ b[k, n] with a and b of one dtype (float32, bfloat16 or "
                "float16), all contiguous on one device; got acc {}, a {}, b {}",
                fn, describeOperand(acc), describeOperand(a), describeOperand(b));
}

}  // namespace

void gemmAccumulateTNReference(const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite) {
  check("gemmAccumulateTNReference", acc, a, b);
  if (overwrite) acc.zero_();
  acc.addmm_(a.to(at::kFloat).t(), b.to(at::kFloat));
}

void gemmAccumulateTN(const at::Tensor& acc, const at::Tensor& a, const at::Tensor& b, bool overwrite) {
  if (!acc.defined() || !acc.is_cuda()) {
    gemmAccumulateTNReference(acc, a, b, overwrite);
    return;
  }
#ifdef TESSERA_HAVE_NCCL
  check("gemmAccumulateTN", acc, a, b);
  const auto type = a.scalar_type() == at::kBFloat16 ? detail::GemmInput::BFloat16
                    : a.scalar_type() == at::kHalf   ? detail::GemmInput::Float16
                                                     : detail::GemmInput::Float32;
  const int device = acc.device().index();
  const auto err = detail::launchGemmAccumulateTN(acc.data_ptr<float>(), a.data_ptr(), b.data_ptr(), type, acc.size(0),
                                                  acc.size(1), a.size(0), overwrite, cuda::currentStream(device), device);
  TESSERA_CHECK(err.empty(), "gemmAccumulateTN: acc {} += a {}ᵀ b {} failed on cuda:{}: {}", describeOperand(acc), describeOperand(a),
                describeOperand(b), device, err);
#else
  TESSERA_CHECK(false, "gemmAccumulateTN: tensors are on {} but tessera was built without CUDA", acc.device().str());
#endif
}

void gemmAccumulateTNInto(at::Tensor& acc, at::IntArrayRef sizes, const at::Device& device, const at::Tensor& a,
                          const at::Tensor& b) {
  const bool fresh = !acc.defined();
  if (fresh) acc = at::empty(sizes, at::TensorOptions().dtype(at::kFloat).device(device));
  gemmAccumulateTN(acc, a, b, /*overwrite=*/fresh);
}

at::Tensor weightGradTN(const at::Tensor& a, const at::Tensor& b, c10::ScalarType dtype) {
  const auto in = a.scalar_type();
  if (dtype != at::kFloat || in == at::kFloat || in != b.scalar_type() || (in != at::kBFloat16 && in != at::kHalf)) {
    return a.t().mm(b).to(dtype);
  }
  TESSERA_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(0) == b.size(0),
                "weightGradTN: needs a[k, m] and b[k, n]; got a {}, b {}", describeOperand(a), describeOperand(b));
  at::Tensor out;
  gemmAccumulateTNInto(out, {a.size(1), b.size(1)}, a.device(), a.contiguous(), b.contiguous());
  return out;
}

}  // namespace tessera::kernels
