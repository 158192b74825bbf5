// Argument checks, the CPU reference and device dispatch of the bucket copies (bucket_copy.h).
#include "kernels/bucket_copy.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "tessera/common/error.h"

#ifdef TESSERA_HAVE_NCCL
#include "comm/nccl/cuda_stream.h"
#include "kernels/bucket_copy_cuda.h"
#endif

namespace tessera::kernels {
namespace {

bool supported(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

std::string dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

std::string describeSlot(const at::Tensor& t) {
  return fmt::format("shape [{}], {}, {}", fmt::join(t.sizes(), ", "), dtypeName(t.scalar_type()), t.device().str());
}

// Checks everything the contract asks; `role` is "srcs" or "dsts". Throws tessera::Error.
void checkArgs(const char* fn, const char* role, const std::vector<at::Tensor>& ts, const at::Tensor& flat,
               const std::vector<int64_t>& offsets) {
  TESSERA_CHECK(flat.defined(), "{}: the bucket (flat) is an undefined tensor", fn);
  const std::string bucket =
      fmt::format("the bucket (numel {}, {}, {})", flat.numel(), dtypeName(flat.scalar_type()), flat.device().str());
  TESSERA_CHECK(supported(flat.scalar_type()), "{}: {} has an unsupported dtype (float32/bfloat16/float16 only)", fn,
                bucket);
  TESSERA_CHECK(flat.is_contiguous(), "{}: {} is not contiguous", fn, bucket);
  TESSERA_CHECK(ts.size() == offsets.size(), "{}: {} has {} tensors but offsets has {} ({})", fn, role, ts.size(),
                offsets.size(), bucket);
  // Only cpu/cuda tensors have addresses to compare (meta tensors have none).
  const bool addressed = (flat.is_cpu() || flat.is_cuda()) && flat.numel() > 0;
  const auto flatBegin = addressed ? reinterpret_cast<uintptr_t>(flat.data_ptr()) : 0;
  const auto flatEnd = flatBegin + static_cast<uintptr_t>(flat.nbytes());
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    TESSERA_CHECK(t.defined(), "{}: {}[{}] is an undefined tensor ({})", fn, role, i, bucket);
    const int64_t off = offsets[i], n = t.numel();
    TESSERA_CHECK(t.device() == flat.device(), "{}: {}[{}] ({}) is on {}, but {} is on {}", fn, role, i, describeSlot(t),
                  t.device().str(), bucket, flat.device().str());
    TESSERA_CHECK(supported(t.scalar_type()), "{}: {}[{}] ({}) has an unsupported dtype (float32/bfloat16/float16 only)",
                  fn, role, i, describeSlot(t));
    TESSERA_CHECK(t.is_contiguous(), "{}: {}[{}] ({}) is not contiguous", fn, role, i, describeSlot(t));
    TESSERA_CHECK(off >= 0 && off <= flat.numel() - n,
                  "{}: {}[{}] ({}) at offset {} needs elements [{}, {}) which lie outside {}", fn, role, i, describeSlot(t),
                  off, off, off + n, bucket);
    // The only aliasing allowed: the tensor is its own range of the bucket, same dtype.
    if (!addressed || n == 0) continue;
    const auto p = reinterpret_cast<uintptr_t>(t.data_ptr());
    const bool overlapsFlat = p < flatEnd && p + t.nbytes() > flatBegin;
    const bool ownRange = t.scalar_type() == flat.scalar_type() &&
                          p == flatBegin + static_cast<uintptr_t>(off) * flat.element_size();
    TESSERA_CHECK(!overlapsFlat || ownRange,
                  "{}: {}[{}] ({}) shares memory with {} but is not exactly its range at offset {} with the bucket's "
                  "dtype",
                  fn, role, i, describeSlot(t), bucket, off);
  }
  // Ranges must not overlap: sort the non-empty ones by offset and compare neighbours.
  std::vector<size_t> order;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].numel() > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t a = order[k - 1], b = order[k];
    TESSERA_CHECK(offsets[a] + ts[a].numel() <= offsets[b],
                  "{}: {}[{}] ({}) at offset {} overlaps {}[{}] ({}) at offset {}: elements [{}, {}) and [{}, {}) of {}",
                  fn, role, b, describeSlot(ts[b]), offsets[b], role, a, describeSlot(ts[a]), offsets[a], offsets[b],
                  offsets[b] + ts[b].numel(), offsets[a], offsets[a] + ts[a].numel(), bucket);
  }
}

void flattenReference(const std::vector<at::Tensor>& srcs, const at::Tensor& flat, const std::vector<int64_t>& offsets,
                      double scale) {
  c10::NoGradGuard noGrad;
  const auto fscale = static_cast<float>(scale);  // scaling is fp32 math, as on the GPU
  auto flat1d = flat.view({-1});
  for (size_t i = 0; i < srcs.size(); ++i) {
    const int64_t n = srcs[i].numel();
    if (n == 0) continue;
    auto dst = flat1d.narrow(0, offsets[i], n);
    auto src = srcs[i].view({-1});
    if (fscale == 1.0f) {
      dst.copy_(src);
    } else {
      dst.copy_(src.to(at::kFloat).mul(at::scalar_tensor(fscale, src.options().dtype(at::kFloat))));
    }
  }
}

void unflattenReference(const at::Tensor& flat, const std::vector<at::Tensor>& dsts, const std::vector<int64_t>& offsets) {
  c10::NoGradGuard noGrad;
  auto flat1d = flat.view({-1});
  for (size_t i = 0; i < dsts.size(); ++i) {
    const int64_t n = dsts[i].numel();
    if (n == 0) continue;
    auto dst = dsts[i].view({-1});  // a view: copy_ writes through to dsts[i]
    dst.copy_(flat1d.narrow(0, offsets[i], n));
  }
}

#ifdef TESSERA_HAVE_NCCL
detail::CopyDtype copyDtype(at::ScalarType t) {
  return t == at::kFloat ? detail::CopyDtype::F32 : t == at::kBFloat16 ? detail::CopyDtype::BF16 : detail::CopyDtype::F16;
}

// toFlat: tensors -> bucket (flatten), else bucket -> tensors.
void launchCuda(const char* fn, const std::vector<at::Tensor>& ts, const at::Tensor& flat,
                const std::vector<int64_t>& offsets, float scale, bool toFlat) {
  std::vector<detail::CopyItem> items;
  items.reserve(ts.size());
  auto* base = static_cast<char*>(flat.data_ptr());
  for (size_t i = 0; i < ts.size(); ++i) {
    void* range = base + offsets[i] * flat.element_size();
    void* tensor = ts[i].data_ptr();
    items.push_back({toFlat ? tensor : range, toFlat ? range : tensor, ts[i].numel(),
                     copyDtype(toFlat ? ts[i].scalar_type() : flat.scalar_type()),
                     copyDtype(toFlat ? flat.scalar_type() : ts[i].scalar_type())});
  }
  const int device = flat.device().index();
  const std::string err = detail::launchMultiTensorCopy(items.data(), static_cast<int>(items.size()), scale,
                                                        cuda::currentStream(device), device);
  TESSERA_CHECK(err.empty(), "{}: CUDA kernel multiTensorCopyKernel failed on cuda:{} ({} tensors, bucket numel {}): {}",
                fn, device, ts.size(), flat.numel(), err);
}
#endif

void dispatch(const char* fn, const std::vector<at::Tensor>& ts, const at::Tensor& flat,
              const std::vector<int64_t>& offsets, double scale, bool toFlat) {
  checkArgs(fn, toFlat ? "srcs" : "dsts", ts, flat, offsets);
  if (flat.device().is_cpu()) {
    if (toFlat) flattenReference(ts, flat, offsets, scale);
    else unflattenReference(flat, ts, offsets);
    return;
  }
  TESSERA_CHECK(flat.device().is_cuda(), "{}: tensors on {} are not supported (cpu or cuda only)", fn,
                flat.device().str());
#ifdef TESSERA_HAVE_NCCL
  launchCuda(fn, ts, flat, offsets, static_cast<float>(scale), toFlat);
#else
  TESSERA_CHECK(false, "{}: tensors are on {} but tessera was built without CUDA (no CUDA toolkit/NCCL found)", fn,
                flat.device().str());
#endif
}

}  // namespace

void flattenScaleCast(const std::vector<at::Tensor>& srcs, const at::Tensor& flat, const std::vector<int64_t>& offsets,
                      double scale) {
  dispatch("flattenScaleCast", srcs, flat, offsets, scale, /*toFlat=*/true);
}

void unflattenCast(const at::Tensor& flat, const std::vector<at::Tensor>& dsts, const std::vector<int64_t>& offsets) {
  dispatch("unflattenCast", dsts, flat, offsets, 1.0, /*toFlat=*/false);
}

void flattenScaleCastReference(const std::vector<at::Tensor>& srcs, const at::Tensor& flat,
                               const std::vector<int64_t>& offsets, double scale) {
  checkArgs("flattenScaleCastReference", "srcs", srcs, flat, offsets);
  flattenReference(srcs, flat, offsets, scale);
}

void unflattenCastReference(const at::Tensor& flat, const std::vector<at::Tensor>& dsts,
                            const std::vector<int64_t>& offsets) {
  checkArgs("unflattenCastReference", "dsts", dsts, flat, offsets);
  unflattenReference(flat, dsts, offsets);
}

}  // namespace tessera::kernels
