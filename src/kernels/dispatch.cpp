// Host-side helpers of the fused kernels' front ends (see dispatch.h).
#include "kernels/dispatch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>

#include "tessera/comm/types.h"
#include "tessera/common/error.h"

#ifdef TESSERA_HAVE_NCCL
#include "comm/nccl/cuda_stream.h"
#endif

namespace tessera::kernels::detail {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return fmt::format("[{}], {}, {}", fmt::join(t.sizes(), ", "), dtypeName(t.scalar_type()), t.device().str());
}

void require(bool ok, const char* op, const char* what, const char* requirement, const at::Tensor& t) {
  TESSERA_CHECK(ok, "{}: {} must be {} (got {})", op, what, requirement, describe(t));
}

ElemType elemType(const char* op, const char* what, const at::Tensor& t) {
  require(t.defined(), op, what, "a float32, bfloat16 or float16 tensor", t);
  switch (t.scalar_type()) {
    case at::kFloat: return ElemType::F32;
    case at::kBFloat16: return ElemType::BF16;
    case at::kHalf: return ElemType::F16;
    default: require(false, op, what, "a float32, bfloat16 or float16 tensor", t);
  }
  return ElemType::F32;
}

bool onCuda(const char* op, const at::Tensor& t) {
  if (t.device().is_cpu()) return false;
  TESSERA_CHECK(t.device().is_cuda(), "{}: tensors on {} are not supported (cpu or cuda only)", op, t.device().str());
#ifdef TESSERA_HAVE_NCCL
  return true;
#else
  TESSERA_CHECK(false, "{}: tensors are on {} but tessera was built without CUDA (no CUDA toolkit/NCCL found)", op,
                t.device().str());
  return false;
#endif
}

Launch launchFor(const at::Tensor& t) {
  const int device = t.device().index();
#ifdef TESSERA_HAVE_NCCL
  return {cuda::currentStream(device), device};
#else
  return {nullptr, device};
#endif
}

void checkLaunched(const std::string& err, const char* op, const char* kernel, const at::Tensor& t) {
  TESSERA_CHECK(err.empty(), "{}: CUDA kernel {} failed on {} (input {}): {}", op, kernel, t.device().str(),
                describe(t), err);
}

bool aligned(const at::Tensor& t, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace tessera::kernels::detail
