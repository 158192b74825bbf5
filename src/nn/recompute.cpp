#include "tessera/nn/recompute.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <vector>

#include "tessera/common/autocast.h"
#include "common/choice.h"
#include "tessera/common/error.h"

namespace tessera::nn {

namespace {
constexpr Choices<Recompute, 3> kRecompute{
    "recompute mode", {{{Recompute::None, "none"}, {Recompute::Full, "full"}, {Recompute::Selective, "selective"}}}};
}  // namespace

Recompute parseRecompute(const std::string& s) { return kRecompute.parse(s); }
const char* toString(Recompute r) { return kRecompute.name(r); }

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Recomputations' nested backwards this thread is inside (the engine runs a reentrant backward
// on the thread that called it), and the callbacks queueAtBackwardEnd deferred meanwhile.
thread_local int nestedBackwards = 0;
thread_local std::vector<std::function<void()>> deferredCallbacks;

// The nested backward of a recomputation; at the outermost one's return (a node of the whole
// backward is running again) the deferred callbacks go to the whole backward's graph task.
void nestedBackward(const at::Tensor& y, const at::Tensor& grad) {
  ++nestedBackwards;
  try {
    torch::autograd::backward({y}, {grad});
  } catch (...) {
    if (--nestedBackwards == 0) deferredCallbacks.clear();  // the whole backward fails with this
    throw;
  }
  if (--nestedBackwards > 0) return;
  auto callbacks = std::move(deferredCallbacks);
  deferredCallbacks.clear();
  for (auto& cb : callbacks) torch::autograd::Engine::get_default_engine().queue_callback(std::move(cb));
}

struct Holder : torch::CustomClassHolder {
  Holder(MultiFn f_, std::function<void()> b) : f(std::move(f_)), before(std::move(b)) {}
  MultiFn f;
  std::function<void()> before;
  CudaAutocastState autocast;  // the forward's, re-established for the recomputation
};

struct Recomputed : torch::autograd::Function<Recomputed> {
  // `xs` is flattened by autograd (one input per tensor); the holder outlives the call in ctx.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Holder> h, at::TensorList xs) {
    h->autocast = currentCudaAutocast();
    ctx->saved_data["f"] = c10::IValue::make_capsule(h);
    ctx->save_for_backward(xs.vec());
    if (h->before) h->before();
    at::NoGradGuard ng;
    return {h->f(xs.vec())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto h = c10::static_intrusive_pointer_cast<Holder>(ctx->saved_data["f"].toCapsule());
    variable_list inputs;
    for (const auto& x : ctx->get_saved_variables()) inputs.push_back(x.detach().requires_grad_(x.requires_grad()));
    if (h->before) h->before();
    at::Tensor y;
    {
      at::AutoGradMode on(true);
      CudaAutocast autocast(h->autocast);  // backward runs without the forward's autocast
      y = h->f(inputs);
    }
    if (y.requires_grad()) nestedBackward(y, grads[0]);
    variable_list out{at::Tensor()};  // the holder
    for (const auto& x : inputs) out.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    return out;
  }
};
}  // namespace

void queueAtBackwardEnd(std::function<void()> callback) {
  if (nestedBackwards > 0) {
    deferredCallbacks.push_back(std::move(callback));
    return;
  }
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

at::Tensor recompute(const MultiFn& f, const std::vector<at::Tensor>& xs) {
  return Recomputed::apply(c10::make_intrusive<Holder>(f, nullptr), at::TensorList(xs))[0];
}

at::Tensor recompute(const Fn& f, const at::Tensor& x, const std::function<void()>& before) {
  MultiFn one = [f](const std::vector<at::Tensor>& v) { return f(v[0]); };
  const std::vector<at::Tensor> xs{x};
  return Recomputed::apply(c10::make_intrusive<Holder>(std::move(one), before), at::TensorList(xs))[0];
}

}  // namespace tessera::nn
