// SwiGLU and bias + GELU: checks, the ATen references and the CUDA dispatch (activations.h).
#include "kernels/activations.h"

#include <ATen/ATen.h>

#include "tessera/common/error.h"
#include "kernels/dispatch.h"

#ifdef TESSERA_HAVE_NCCL
#include "kernels/activations_cuda.h"
#endif

namespace tessera::kernels {
namespace {

using detail::require;

// h contiguous [..., width], width > 0 (even for SwiGLU). Returns the rows.
int64_t checkH(const char* op, const at::Tensor& h, bool swiglu) {
  detail::elemType(op, "h", h);
  require(h.dim() >= 1 && h.size(-1) > 0 && h.is_contiguous() && (!swiglu || h.size(-1) % 2 == 0), op, "h",
          swiglu ? "a contiguous [..., 2F] tensor ([gate | up])" : "a contiguous [..., F] tensor", h);
  return h.numel() / h.size(-1);
}

void checkBias(const char* op, const at::Tensor& h, const at::Tensor& bias) {
  require(bias.defined() && bias.dim() == 1 && bias.size(0) == h.size(-1) && at::isFloatingType(bias.scalar_type()) &&
              bias.device() == h.device(),
          op, "bias", "a floating [F] tensor on h's device, F = h's last dimension", bias);
}

// gy of `shape` in h's dtype on h's device.
void checkGy(const char* op, const at::Tensor& gy, const at::Tensor& h, at::IntArrayRef shape) {
  require(gy.defined() && gy.sizes() == shape && gy.scalar_type() == h.scalar_type() && gy.device() == h.device(), op,
          "gy", "a tensor of y's shape in h's dtype on h's device", gy);
}

std::vector<int64_t> halfLast(const at::Tensor& h) {
  auto s = h.sizes().vec();
  s.back() /= 2;
  return s;
}

#ifdef TESSERA_HAVE_NCCL
// h's part of the SwiGLU / bias + GELU arguments (h checked by the caller).
template <typename Args>
Args argsFor(const char* op, const at::Tensor& h, int64_t rows, int64_t ffn) {
  Args a{};
  a.h = h.data_ptr();
  a.type = detail::elemType(op, "h", h);
  a.rows = rows;
  a.ffn = ffn;
  return a;
}

bool vec4(int64_t ffn, std::initializer_list<at::Tensor> ts) {
  if (ffn % 4 != 0) return false;
  for (const auto& t : ts) {
    if (t.defined() && !detail::aligned(t, 4 * t.element_size())) return false;
  }
  return true;
}
#endif

}  // namespace

at::Tensor swigluForwardReference(const at::Tensor& h) {
  checkH("swigluForwardReference", h, true);
  at::NoGradGuard noGrad;
  const int64_t f = h.size(-1) / 2;
  auto hf = h.to(at::kFloat);
  return (at::silu(hf.narrow(-1, 0, f)) * hf.narrow(-1, f, f)).to(h.scalar_type());
}

at::Tensor swigluBackwardReference(const at::Tensor& gy, const at::Tensor& h) {
  checkH("swigluBackwardReference", h, true);
  checkGy("swigluBackwardReference", gy, h, halfLast(h));
  at::NoGradGuard noGrad;
  const int64_t f = h.size(-1) / 2;
  auto hf = h.to(at::kFloat), g = gy.to(at::kFloat);
  auto gate = hf.narrow(-1, 0, f), up = hf.narrow(-1, f, f);
  auto s = at::sigmoid(gate);
  auto gg = g * up * (s * (1 + gate * (1 - s)));
  auto gu = g * (gate * s);
  return at::cat({gg, gu}, -1).to(h.scalar_type());
}

at::Tensor biasGeluForwardReference(const at::Tensor& h, const at::Tensor& bias) {
  checkH("biasGeluForwardReference", h, false);
  checkBias("biasGeluForwardReference", h, bias);
  at::NoGradGuard noGrad;
  return at::gelu(h.to(at::kFloat) + bias.to(at::kFloat)).to(h.scalar_type());
}

BiasGeluGrads biasGeluBackwardReference(const at::Tensor& gy, const at::Tensor& h, const at::Tensor& bias) {
  checkH("biasGeluBackwardReference", h, false);
  checkBias("biasGeluBackwardReference", h, bias);
  checkGy("biasGeluBackwardReference", gy, h, h.sizes());
  at::NoGradGuard noGrad;
  auto gz = at::gelu_backward(gy.to(at::kFloat), h.to(at::kFloat) + bias.to(at::kFloat));
  return {gz.to(h.scalar_type()), gz.reshape({-1, h.size(-1)}).sum(0)};
}

at::Tensor swigluForward(const at::Tensor& h) {
  const char* op = "swigluForward";
  if (!detail::onCuda(op, h)) return swigluForwardReference(h);
#ifdef TESSERA_HAVE_NCCL
  const int64_t rows = checkH(op, h, true);
  auto y = at::empty(halfLast(h), h.options());
  auto a = argsFor<detail::SwigluArgs>(op, h, rows, h.size(-1) / 2);
  a.y = y.data_ptr();
  a.vec4 = vec4(a.ffn, {h, y});
  detail::checkLaunched(detail::launchSwigluForward(a, detail::launchFor(h)), op, "swigluForwardKernel", h);
  return y;
#else
  return {};
#endif
}

at::Tensor swigluBackward(const at::Tensor& gyIn, const at::Tensor& h) {
  const char* op = "swigluBackward";
  if (!detail::onCuda(op, h)) return swigluBackwardReference(gyIn, h);
#ifdef TESSERA_HAVE_NCCL
  const int64_t rows = checkH(op, h, true);
  checkGy(op, gyIn, h, halfLast(h));
  const auto gy = gyIn.contiguous();
  auto gh = at::empty(h.sizes(), h.options());
  auto a = argsFor<detail::SwigluArgs>(op, h, rows, h.size(-1) / 2);
  a.gy = gy.data_ptr();
  a.gh = gh.data_ptr();
  a.vec4 = vec4(a.ffn, {h, gy, gh});
  detail::checkLaunched(detail::launchSwigluBackward(a, detail::launchFor(h)), op, "swigluBackwardKernel", h);
  return gh;
#else
  return {};
#endif
}

at::Tensor biasGeluForward(const at::Tensor& h, const at::Tensor& bias) {
  const char* op = "biasGeluForward";
  if (!detail::onCuda(op, h)) return biasGeluForwardReference(h, bias);
#ifdef TESSERA_HAVE_NCCL
  const int64_t rows = checkH(op, h, false);
  checkBias(op, h, bias);
  const auto b = bias.to(at::kFloat).contiguous();
  auto y = at::empty(h.sizes(), h.options());
  auto a = argsFor<detail::BiasGeluArgs>(op, h, rows, h.size(-1));
  a.bias = b.data_ptr<float>();
  a.y = y.data_ptr();
  a.vec4 = vec4(a.ffn, {h, y}) && detail::aligned(b, 16);
  detail::checkLaunched(detail::launchBiasGeluForward(a, detail::launchFor(h)), op, "biasGeluForwardKernel", h);
  return y;
#else
  return {};
#endif
}

BiasGeluGrads biasGeluBackward(const at::Tensor& gyIn, const at::Tensor& h, const at::Tensor& bias) {
  const char* op = "biasGeluBackward";
  if (!detail::onCuda(op, h)) return biasGeluBackwardReference(gyIn, h, bias);
#ifdef TESSERA_HAVE_NCCL
  const int64_t rows = checkH(op, h, false);
  checkBias(op, h, bias);
  checkGy(op, gyIn, h, h.sizes());
  const auto gy = gyIn.contiguous();
  const auto b = bias.to(at::kFloat).contiguous();
  const auto launch = detail::launchFor(h);
  const int64_t ffn = h.size(-1);
  BiasGeluGrads out{at::empty(h.sizes(), h.options()), at::empty({ffn}, h.options().dtype(at::kFloat))};
  const int64_t groups = detail::biasGeluGroups(rows, ffn, launch.device);
  auto partial = at::empty({groups, ffn}, h.options().dtype(at::kFloat));
  auto a = argsFor<detail::BiasGeluArgs>(op, h, rows, ffn);
  a.bias = b.data_ptr<float>();
  a.gy = gy.data_ptr();
  a.gh = out.gh.data_ptr();
  a.partial = partial.data_ptr<float>();
  a.gb = out.gb.data_ptr<float>();
  a.groups = groups;
  a.vec4 = vec4(ffn, {h, gy, out.gh}) && detail::aligned(b, 16);
  detail::checkLaunched(detail::launchBiasGeluBackward(a, launch), op, "biasGeluBackwardKernel", h);
  return out;
#else
  return {};
#endif
}

}  // namespace tessera::kernels
