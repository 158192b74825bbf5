#pragma once
// AdamW over whole (unflattened) parameters, such as DDP's replicas and TP shards, with
// tessera's AdamW kernel (kernels/adamw.h: one fused kernel per tensor on CUDA, the ATen
// reference on the CPU): the update ShardedAdamW applies to FSDP's flat shards, so DDP and
// FSDP runs step identically. With `multiTensor` (CUDA parameters only), one call of
// kernels/multi_tensor_adamw.h steps every parameter in a few launches (the same math per
// element, bitwise the per-tensor kernel's); CPU parameters always take the per-tensor
// reference. Each parameter has its own weight-decay switch (no decay on norms and biases:
// decaysByName). State is allocated at construction (zeros) so checkpoints
// can address it before the first step. Every parameter is stepped, also with a zero gradient;
// one without .grad is an error naming it. The learning rate may change between steps
// (setLr: LR schedules). Local; not thread-safe.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tessera {

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 1e-2;
};

}  // namespace tessera

namespace tessera::optim {

// The usual weight-decay rule: decay matrices, not norms' weights nor biases (names ending in
// "norm.weight", "ln1.weight", ".bias", ...: any name whose last part is "bias" or whose
// owner's name contains "norm" or "ln"), and embeddings only when `embeddings` is set.
bool decaysByName(const std::string& name, bool embeddings);

class AdamW {
 public:
  // names[i] names params[i] in errors; decay[i]: whether params[i] takes weight decay.
  AdamW(std::vector<at::Tensor> params, std::vector<std::string> names, std::vector<bool> decay, AdamWOptions o,
        bool multiTensor = false);
  void step();
  // The step with every gradient multiplied by `gradScale` (a one-element float32 tensor on the
  // parameters' device: gradient clipping's coefficient, computed there without a host
  // synchronisation; see parallel/grad_norm.h). The multi-tensor CUDA path scales as it reads
  // (one pass less over the gradients, .grad left as it was); the others scale .grad in place
  // first. Either way the update is bitwise that of step() on the scaled gradients.
  void step(const at::Tensor& gradScale);
  void setLr(double lr) { o_.lr = lr; }
  int64_t steps() const { return step_; }
  void setSteps(int64_t s) { step_ = s; }
  // expAvg()[i], expAvgSq()[i]: state of params[i] (same shape, fp32).
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<at::Tensor>& expAvg() const { return m_; }
  const std::vector<at::Tensor>& expAvgSq() const { return v_; }

 private:
  std::vector<at::Tensor> params_, m_, v_;
  std::vector<std::string> names_;
  std::vector<bool> decay_;
  AdamWOptions o_;
  bool multiTensor_;
  int64_t step_ = 0;
};

}  // namespace tessera::optim
