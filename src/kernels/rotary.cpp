// Rotary embedding on q and k in place: checks, the ATen reference and the CUDA dispatch
// (rotary.h).
#include "kernels/rotary.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/rotary_cuda.h"
#endif

namespace tessera::kernels {
namespace {

using detail::require;

void check(const char* op, const at::Tensor& h, int64_t heads, int64_t hd, const at::Tensor& cos,
           const at::Tensor& sin) {
  detail::elemType(op, "h", h);
  require(h.dim() == 3 && h.is_contiguous(), op, "h", "a contiguous [T, B, W] tensor", h);
  TESSERA_CHECK(heads >= 0 && hd > 0 && hd % 2 == 0 && heads * hd <= h.size(2),
                "{}: {} heads of dimension {} (even, > 0) do not fit h's rows of {} ({})", op, heads, hd, h.size(2),
                detail::describe(h));
  for (const auto& [what, t] : {std::pair<const char*, const at::Tensor&>{"cos", cos}, {"sin", sin}}) {
    require(t.defined() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.size(0) >= h.size(0) &&
                t.size(1) == hd && t.is_contiguous() && t.device() == h.device(),
            op, what, "a contiguous float32 [>= T, headDim] table on h's device", t);
  }
}

// The q/k heads of h as [T, B, heads, hd] (a view of h), and the tables as [T, 1, 1, hd].
struct Views {
  at::Tensor qk, cos, sin;
};
Views views(const at::Tensor& h, int64_t heads, int64_t hd, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t T = h.size(0), B = h.size(1);
  return {h.narrow(2, 0, heads * hd).view({T, B, heads, hd}), cos.narrow(0, 0, T).view({T, 1, 1, hd}),
          sin.narrow(0, 0, T).view({T, 1, 1, hd})};
}

#ifdef TESSERA_HAVE_NCCL
void launch(const char* op, const at::Tensor& in, const at::Tensor& out, int64_t heads, int64_t hd,
            const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  detail::RopeArgs a{};
  a.in = in.data_ptr();
  a.out = out.data_ptr();
  a.type = detail::elemType(op, "h", in);
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.tokens = in.size(0);
  a.batch = in.size(1);
  a.width = in.size(2);
  a.heads = static_cast<int>(heads);
  a.headDim = static_cast<int>(hd);
  a.inverse = inverse;
  const int64_t pair = 2 * in.element_size();
  a.vec2 = (hd / 2) % 2 == 0 && a.width % 2 == 0 && detail::aligned(in, pair) && detail::aligned(out, pair) &&
           detail::aligned(cos, 8) && detail::aligned(sin, 8);
  detail::checkLaunched(detail::launchRope(a, detail::launchFor(in)), op, "ropeKernel", in);
}
#endif

}  // namespace

void ropeInPlaceReference(const at::Tensor& h, int64_t heads, int64_t hd, const at::Tensor& cos,
                          const at::Tensor& sin) {
  check("ropeInPlaceReference", h, heads, hd, cos, sin);
  at::NoGradGuard noGrad;
  const auto v = views(h, heads, hd, cos, sin);
  auto xf = v.qk.to(at::kFloat);
  auto halves = xf.chunk(2, -1);
  auto rotated = at::cat({-halves[1], halves[0]}, -1);
  v.qk.copy_((xf * v.cos + rotated * v.sin).to(h.scalar_type()));
}

at::Tensor ropeBackwardReference(const at::Tensor& gh, int64_t heads, int64_t hd, const at::Tensor& cos,
                                 const at::Tensor& sin) {
  check("ropeBackwardReference", gh, heads, hd, cos, sin);
  at::NoGradGuard noGrad;
  auto gx = gh.clone(at::MemoryFormat::Contiguous);
  const auto v = views(gx, heads, hd, cos, sin);
  auto gf = v.qk.to(at::kFloat);
  auto halves = gf.chunk(2, -1);
  auto rotated = at::cat({halves[1], -halves[0]}, -1);
  v.qk.copy_((gf * v.cos + rotated * v.sin).to(gh.scalar_type()));
  return gx;
}

void ropeInPlace(const at::Tensor& h, int64_t heads, int64_t hd, const at::Tensor& cos, const at::Tensor& sin) {
  const char* op = "ropeInPlace";
  if (!detail::onCuda(op, h)) return ropeInPlaceReference(h, heads, hd, cos, sin);
#ifdef TESSERA_HAVE_NCCL
  check(op, h, heads, hd, cos, sin);
  launch(op, h, h, heads, hd, cos, sin, /*inverse=*/false);
#endif
}

at::Tensor ropeBackward(const at::Tensor& ghIn, int64_t heads, int64_t hd, const at::Tensor& cos,
                        const at::Tensor& sin) {
  const char* op = "ropeBackward";
  if (!detail::onCuda(op, ghIn)) return ropeBackwardReference(ghIn.contiguous(), heads, hd, cos, sin);
#ifdef TESSERA_HAVE_NCCL
  require(ghIn.defined() && ghIn.dim() == 3, op, "gh", "a [T, B, W] tensor", ghIn);
  const auto gh = ghIn.contiguous();
  check(op, gh, heads, hd, cos, sin);
  auto gx = at::empty_like(gh, at::MemoryFormat::Contiguous);
  launch(op, gh, gx, heads, hd, cos, sin, /*inverse=*/true);
  return gx;
#else
  return {};
#endif
}

}  // namespace tessera::kernels
