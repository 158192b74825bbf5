#include "parallel/data_parallel/fsdp/hooks.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "tessera/common/error.h"
#include "parallel/data_parallel/fsdp/impl.h"

namespace tessera::fsdp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct PreBackward : torch::autograd::Function<PreBackward> {
  static variable_list forward(AutogradContext* ctx, at::TensorList outs, int64_t self, int64_t unit) {
    ctx->saved_data["self"] = self;
    ctx->saved_data["unit"] = unit;
    return variable_list(outs.begin(), outs.end());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* f = reinterpret_cast<FullyShardedDataParallel::Impl*>(ctx->saved_data["self"].toInt());
    f->onPreBackward(static_cast<int>(ctx->saved_data["unit"].toInt()));
    grads.push_back(at::Tensor());  // self
    grads.push_back(at::Tensor());  // unit
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> attachPreBackward(FullyShardedDataParallel::Impl& fsdp, int unit, const std::vector<at::Tensor>& outs) {
  std::vector<at::Tensor> grad;
  std::vector<size_t> where;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].defined() && outs[i].requires_grad()) {
      grad.push_back(outs[i]);
      where.push_back(i);
    }
  }
  if (grad.empty()) return outs;
  auto wrapped = PreBackward::apply(at::TensorList(grad), static_cast<int64_t>(reinterpret_cast<intptr_t>(&fsdp)),
                                    static_cast<int64_t>(unit));
  auto res = outs;
  for (size_t k = 0; k < where.size(); ++k) res[where[k]] = wrapped[k];
  return res;
}

std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t> addGradReadyHook(FullyShardedDataParallel::Impl& fsdp,
                                                                              int unit, int index,
                                                                              const at::Tensor& param,
                                                                              const std::string& name) {
  auto acc = torch::autograd::impl::grad_accumulator(param);
  TESSERA_CHECK(acc, "FSDP: parameter '{}' is not a leaf with a gradient accumulator", name);
  auto* f = &fsdp;
  auto key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [f, unit, index](const variable_list& outputs, const variable_list&) {
        f->onGradReady(unit, index);
        return outputs;
      }));
  return {std::move(acc), key};
}

}  // namespace tessera::fsdp
