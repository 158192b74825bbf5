// RMSNorm / LayerNorm: argument checks, the ATen references and the CUDA dispatch (norm.h).
#include "kernels/norm.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"
#include "kernels/norm_internal.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/norm_cuda.h"
#endif

namespace tessera::kernels {
namespace detail {

bool floatingType(c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

at::Tensor asFloat(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

int64_t checkNormInputs(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& bias) {
  elemType(op, "x", x);
  require(x.dim() >= 1 && x.size(-1) > 0 && x.is_contiguous(), op, "x", "a contiguous [..., d] tensor with d > 0", x);
  const int64_t d = x.size(-1);
  require(weight.defined() && weight.dim() == 1 && weight.size(0) == d && floatingType(weight.scalar_type()) &&
              weight.device() == x.device(),
          op, "weight", "a floating [d] tensor on x's device, d = x's last dimension", weight);
  TESSERA_CHECK(kind == NormKind::Layer || !bias.defined(), "{}: RMSNorm takes no bias (got {})", op, describe(bias));
  if (bias.defined()) {
    require(bias.dim() == 1 && bias.size(0) == d && floatingType(bias.scalar_type()) && bias.device() == x.device(),
            op, "bias", "a floating [d] tensor on x's device, d = x's last dimension", bias);
  }
  return d;
}

void checkNormStats(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& mean,
                    const at::Tensor& rstd) {
  const int64_t rows = x.numel() / x.size(-1);
  auto ok = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == at::kFloat && t.numel() == rows && t.is_contiguous() &&
           t.device() == x.device();
  };
  require(ok(rstd), op, "rstd", "the forward's contiguous float32 [rows] statistics on x's device", rstd);
  if (kind == NormKind::Layer) {
    require(ok(mean), op, "mean", "the forward's contiguous float32 [rows] statistics on x's device", mean);
  }
}

NormOutput normForwardCuda(const char* op, NormKind kind, const at::Tensor& x, const at::Tensor& weight,
                           const at::Tensor& bias, double eps, c10::ScalarType outDtype, const at::Tensor& branch,
                           const at::Tensor& s) {
#ifdef TESSERA_HAVE_NCCL
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const auto f32 = x.options().dtype(at::kFloat);
  NormOutput out;
  out.y = at::empty(x.sizes(), x.options().dtype(outDtype));
  out.rstd = at::empty({rows}, f32);
  if (kind == NormKind::Layer) out.mean = at::empty({rows}, f32);
  const auto w = asFloat(weight).contiguous();
  const auto b = bias.defined() ? asFloat(bias).contiguous() : at::Tensor();
  NormForwardArgs a{};
  a.x = x.data_ptr();
  a.xType = elemType(op, "x", x);
  a.y = out.y.data_ptr();
  a.yType = elemType(op, "the output", out.y);
  a.weight = w.data_ptr<float>();
  a.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  a.mean = out.mean.defined() ? out.mean.data_ptr<float>() : nullptr;
  a.rstd = out.rstd.data_ptr<float>();
  a.rows = rows;
  a.d = d;
  a.eps = static_cast<float>(eps);
  a.centered = kind == NormKind::Layer;
  a.vec4 = d % 4 == 0 && aligned(x, 4 * x.element_size()) && aligned(out.y, 4 * out.y.element_size()) &&
           aligned(w, 16) && (!b.defined() || aligned(b, 16));
  if (branch.defined()) {
    a.branch = branch.data_ptr();
    a.branchType = elemType(op, "branch", branch);
    a.s = s.data_ptr();
    a.vec4 = a.vec4 && aligned(branch, 4 * branch.element_size()) && aligned(s, 4 * s.element_size());
  }
  checkLaunched(launchNormForward(a, launchFor(x)), op, "normForwardKernel", x);
  return out;
#else
  return {};
#endif
}

NormGrads normBackwardCuda(const char* op, NormKind kind, const at::Tensor& gy, const at::Tensor& x,
                           const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad,
                           const at::Tensor& gres, const at::Tensor& gbranch) {
#ifdef TESSERA_HAVE_NCCL
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const auto launch = launchFor(x);
  const auto f32 = x.options().dtype(at::kFloat);
  const auto w = asFloat(weight).contiguous();
  NormGrads out;
  out.gx = at::empty(x.sizes(), x.options());
  auto gw = at::empty({d}, f32);
  auto gb = biasGrad ? at::empty({d}, f32) : at::Tensor();
  const int64_t groups = normBackwardGroups(rows, launch.device);
  auto partial = at::empty({groups * (biasGrad ? 2 : 1) * d}, f32);
  NormBackwardArgs a{};
  a.gy = gy.data_ptr();
  a.gyType = elemType(op, "gy", gy);
  a.x = x.data_ptr();
  a.xType = elemType(op, "x", x);
  a.gx = out.gx.data_ptr();
  a.weight = w.data_ptr<float>();
  a.mean = kind == NormKind::Layer ? mean.data_ptr<float>() : nullptr;
  a.rstd = rstd.data_ptr<float>();
  a.gw = gw.data_ptr<float>();
  a.gb = biasGrad ? gb.data_ptr<float>() : nullptr;
  a.partial = partial.data_ptr<float>();
  a.groups = groups;
  a.rows = rows;
  a.d = d;
  a.centered = kind == NormKind::Layer;
  a.vec4 = d % 4 == 0 && aligned(x, 4 * x.element_size()) && aligned(gy, 4 * gy.element_size()) &&
           aligned(out.gx, 4 * out.gx.element_size()) && aligned(w, 16);
  if (gres.defined()) {
    a.gres = gres.data_ptr();
    a.vec4 = a.vec4 && aligned(gres, 4 * gres.element_size());
  }
  if (gbranch.defined()) {
    a.gbranch = gbranch.data_ptr();
    a.gbranchType = elemType(op, "the branch's gradient", gbranch);
    a.vec4 = a.vec4 && aligned(gbranch, 4 * gbranch.element_size());
  }
  checkLaunched(launchNormBackward(a, launch), op, "normBackwardKernel", x);
  out.gw = gw.to(weight.scalar_type());
  if (biasGrad) out.gb = gb;
  return out;
#else
  return {};
#endif
}

}  // namespace detail

namespace {

using detail::asFloat;
using detail::checkNormInputs;
using detail::checkNormStats;
using detail::floatingType;
using detail::require;

const char* name(NormKind k, bool backward) {
  if (k == NormKind::Rms) return backward ? "rmsNormBackward" : "rmsNormForward";
  return backward ? "layerNormBackward" : "layerNormForward";
}

}  // namespace

NormOutput normForwardReference(NormKind kind, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                double eps, c10::ScalarType outDtype) {
  const char* op = name(kind, false);
  const int64_t d = checkNormInputs(op, kind, x, weight, bias);
  TESSERA_CHECK(floatingType(outDtype), "{}: the output dtype must be float32, bfloat16 or float16", op);
  at::NoGradGuard noGrad;
  auto xf = x.reshape({-1, d}).to(at::kFloat);
  NormOutput out;
  if (kind == NormKind::Layer) {
    out.mean = xf.mean(-1);
    xf = xf - out.mean.unsqueeze(1);
  }
  // The model's RMSNorm: x · rsqrt(mean(x²) + eps), then · weight (bitwise the same ops).
  out.rstd = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  auto y = xf * out.rstd;
  y = y * asFloat(weight);
  if (bias.defined()) y = y + asFloat(bias);
  out.rstd = out.rstd.squeeze(1);
  out.y = y.to(outDtype).view(x.sizes());
  return out;
}

NormGrads normBackwardReference(NormKind kind, const at::Tensor& gy, const at::Tensor& x, const at::Tensor& weight,
                                const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad) {
  const char* op = name(kind, true);
  const int64_t d = checkNormInputs(op, kind, x, weight, {});
  require(gy.defined() && gy.sizes() == x.sizes() && floatingType(gy.scalar_type()) && gy.device() == x.device(), op, "gy",
          "a floating tensor of x's shape on x's device", gy);
  checkNormStats(op, kind, x, mean, rstd);
  at::NoGradGuard noGrad;
  auto xf = x.reshape({-1, d}).to(at::kFloat), g = gy.reshape({-1, d}).to(at::kFloat);
  auto r = rstd.unsqueeze(1);
  auto xhat = (kind == NormKind::Layer ? xf - mean.unsqueeze(1) : xf) * r;
  auto gp = g * asFloat(weight);
  auto inner = gp - xhat * (gp * xhat).mean(-1, /*keepdim=*/true);
  if (kind == NormKind::Layer) inner = inner - gp.mean(-1, /*keepdim=*/true);
  NormGrads out;
  out.gx = (inner * r).to(x.scalar_type()).view(x.sizes());
  out.gw = (g * xhat).sum(0).to(weight.scalar_type());
  if (biasGrad) out.gb = g.sum(0);
  return out;
}

NormOutput normForward(NormKind kind, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       double eps, c10::ScalarType outDtype) {
  const char* op = name(kind, false);
  if (!detail::onCuda(op, x)) return normForwardReference(kind, x, weight, bias, eps, outDtype);
  checkNormInputs(op, kind, x, weight, bias);
  return detail::normForwardCuda(op, kind, x, weight, bias, eps, outDtype, {}, {});
}

NormGrads normBackward(NormKind kind, const at::Tensor& gyIn, const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad) {
  const char* op = name(kind, true);
  if (!detail::onCuda(op, x)) return normBackwardReference(kind, gyIn, x, weight, mean, rstd, biasGrad);
  checkNormInputs(op, kind, x, weight, {});
  require(gyIn.defined() && gyIn.sizes() == x.sizes() && gyIn.device() == x.device(), op, "gy",
          "a tensor of x's shape on x's device", gyIn);
  checkNormStats(op, kind, x, mean, rstd);
  return detail::normBackwardCuda(op, kind, gyIn.contiguous(), x, weight, mean, rstd, biasGrad, {}, {});
}

}  // namespace tessera::kernels
