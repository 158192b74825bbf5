#pragma once
// Activation recomputation (Megatron's "full" and "selective"; PyTorch's reentrant
// checkpoint): recompute(f, x) runs f(x) without keeping its intermediate activations (only x
// is saved) and, in backward, runs f(x) again with autograd on and backpropagates through that
// graph: the gradient of x is returned and the gradients of the parameters f uses accumulate
// into their .grad as usual (hooks on them fire: DDP and FSDP see a normal backward).
// The recomputation runs under the CUDA autocast state of the first forward (backward runs on
// the autograd engine's thread, where it is off), so it computes exactly what the first did.
// f must be deterministic given x and its state: `before` (if set) runs before each of the two
// forwards, so a block restores its random-number state (e.g. dropout's call counter) to what
// it was at the first. f may communicate (tensor parallelism): every rank recomputes in the
// same order, so its collectives match. x must be a tensor that requires grad or not; f's
// output must be one tensor. Errors from f surface from forward or backward.
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace tessera::nn {

enum class Recompute { None, Full, Selective };
Recompute parseRecompute(const std::string& s);  // "none" | "full" | "selective"
const char* toString(Recompute r);

using Fn = std::function<at::Tensor(const at::Tensor&)>;
at::Tensor recompute(const Fn& f, const at::Tensor& x, const std::function<void()>& before = nullptr);
// The same for a function of several tensors (selective recompute of attention's core).
using MultiFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
at::Tensor recompute(const MultiFn& f, const std::vector<at::Tensor>& xs);

// For hooks that act once the whole backward has ended (DDP's end of backward): the autograd
// engine's queue_callback, except that from inside a recomputation's nested backward (a separate
// graph task, which ends first) the callback waits until that recomputation's backward returns
// and then goes to the enclosing backward. Call it from a backward hook or node; a nested
// backward that raises drops what it deferred.
void queueAtBackwardEnd(std::function<void()> callback);

}  // namespace tessera::nn
