// Residual add + RMSNorm / LayerNorm: argument checks, the references and the CUDA dispatch
// (add_norm.h) over norm.cpp's kernels.
#include "kernels/add_norm.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"
#include "kernels/norm_internal.h"

namespace tessera::kernels {
namespace {

using detail::require;

const char* addNormName(NormKind k, bool backward) {
  if (k == NormKind::Rms) return backward ? "addRmsNormBackward" : "addRmsNormForward";
  return backward ? "addLayerNormBackward" : "addLayerNormForward";
}

void checkBranch(const char* op, const at::Tensor& x, const at::Tensor& branch) {
  if (!branch.defined()) return;
  require(branch.sizes() == x.sizes() && detail::floatingType(branch.scalar_type()) && branch.device() == x.device(),
          op, "branch", "a float32/bfloat16/float16 tensor of x's shape on x's device", branch);
}

void checkGrads(const char* op, const at::Tensor& gy, const at::Tensor& gs, const at::Tensor& s) {
  require(gy.defined() && gy.sizes() == s.sizes() && detail::floatingType(gy.scalar_type()) &&
              gy.device() == s.device(),
          op, "gy", "a floating tensor of s's shape on s's device", gy);
  if (gs.defined()) {
    require(gs.sizes() == s.sizes() && detail::floatingType(gs.scalar_type()) && gs.device() == s.device(), op, "gs",
            "a floating tensor of s's shape on s's device", gs);
  }
}

void checkBranchDtype(const char* op, c10::optional<c10::ScalarType> t) {
  TESSERA_CHECK(!t || detail::floatingType(*t), "{}: the branch's dtype must be float32, bfloat16 or float16 (got {})",
                op, t ? c10::toString(*t) : "none");
}

// The forward kernel reads the branch in x's dtype, or a 16-bit branch of a float32 stream; s
// is written in x's dtype, so the promoted dtype must be x's.
bool kernelTakes(const at::Tensor& x, const at::Tensor& branch) {
  return branch.scalar_type() == x.scalar_type() || x.scalar_type() == at::kFloat;
}

}  // namespace

AddNormOutput addNormForwardReference(NormKind kind, const at::Tensor& x, const at::Tensor& branch,
                                      const at::Tensor& weight, const at::Tensor& bias, double eps,
                                      c10::ScalarType outDtype) {
  const char* op = addNormName(kind, false);
  detail::checkNormInputs(op, kind, x, weight, bias);
  checkBranch(op, x, branch);
  at::Tensor s = x;
  if (branch.defined()) {
    at::NoGradGuard noGrad;
    s = at::add(x, branch).contiguous();  // the unfused model's add, in the promoted dtype
  }
  auto n = normForwardReference(kind, s, weight, bias, eps, outDtype);
  return {s, n.y, n.mean, n.rstd};
}

AddNormGrads addNormBackwardReference(NormKind kind, const at::Tensor& gy, const at::Tensor& gs, const at::Tensor& s,
                                      const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd,
                                      bool biasGrad, c10::optional<c10::ScalarType> branchDtype) {
  const char* op = addNormName(kind, true);
  detail::checkNormInputs(op, kind, s, weight, {});
  checkGrads(op, gy, gs, s);
  checkBranchDtype(op, branchDtype);
  auto g = normBackwardReference(kind, gy, s, weight, mean, rstd, biasGrad);
  at::NoGradGuard noGrad;
  AddNormGrads out;
  // Autograd's accumulation of the stream's two gradients, in s's dtype.
  out.gx = gs.defined() ? g.gx + gs.to(s.scalar_type()) : g.gx;
  if (branchDtype) out.gbranch = out.gx.to(*branchDtype);
  out.gw = g.gw;
  out.gb = g.gb;
  return out;
}

AddNormOutput addNormForward(NormKind kind, const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                             const at::Tensor& bias, double eps, c10::ScalarType outDtype) {
  const char* op = addNormName(kind, false);
  if (!detail::onCuda(op, x)) return addNormForwardReference(kind, x, branch, weight, bias, eps, outDtype);
  detail::checkNormInputs(op, kind, x, weight, bias);
  checkBranch(op, x, branch);
  TESSERA_CHECK(detail::floatingType(outDtype), "{}: the output dtype must be float32, bfloat16 or float16", op);
  if (!branch.defined() || !kernelTakes(x, branch)) {
    at::Tensor s = x;
    if (branch.defined()) {
      at::NoGradGuard noGrad;
      s = at::add(x, branch).contiguous();
    }
    auto n = detail::normForwardCuda(op, kind, s, weight, bias, eps, outDtype, {}, {});
    return {s, n.y, n.mean, n.rstd};
  }
  const auto br = branch.contiguous();
  auto s = at::empty(x.sizes(), x.options());
  auto n = detail::normForwardCuda(op, kind, x, weight, bias, eps, outDtype, br, s);
  return {s, n.y, n.mean, n.rstd};
}

AddNormGrads addNormBackward(NormKind kind, const at::Tensor& gy, const at::Tensor& gs, const at::Tensor& s,
                             const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd, bool biasGrad,
                             c10::optional<c10::ScalarType> branchDtype) {
  const char* op = addNormName(kind, true);
  if (!detail::onCuda(op, s)) {
    return addNormBackwardReference(kind, gy, gs, s, weight, mean, rstd, biasGrad, branchDtype);
  }
  detail::checkNormInputs(op, kind, s, weight, {});
  checkGrads(op, gy, gs, s);
  checkBranchDtype(op, branchDtype);
  detail::checkNormStats(op, kind, s, mean, rstd);
  const auto gres = gs.defined() ? gs.to(s.scalar_type()).contiguous() : at::Tensor();
  const bool separate = branchDtype && *branchDtype != s.scalar_type();
  const auto gbranch = separate ? at::empty(s.sizes(), s.options().dtype(*branchDtype)) : at::Tensor();
  auto g = detail::normBackwardCuda(op, kind, gy.contiguous(), s, weight, mean, rstd, biasGrad, gres, gbranch);
  AddNormGrads out;
  out.gx = g.gx;
  if (branchDtype) out.gbranch = separate ? gbranch : g.gx;
  out.gw = g.gw;
  out.gb = g.gb;
  return out;
}

}  // namespace tessera::kernels
