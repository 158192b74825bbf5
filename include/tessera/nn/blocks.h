#pragma once
// Blocks: a model's repeated layers as a list of modules applied in order, h = block_k(h), each a
// function of one tensor (as torch::nn::Sequential of such modules), with one place to wrap every
// block's call: fullyShard (parallel/data_parallel/fsdp/fully_shard.h) runs each block inside its
// FSDP unit there, so a model written with Blocks is sharded without rewriting its forward. Local.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tessera::nn {

class BlocksImpl : public torch::nn::Module {
 public:
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  // Runs block `index` on x by calling `block` (its forward), in place of a plain call.
  using Around = std::function<at::Tensor(size_t index, const at::Tensor& x, const Fn& block)>;

  // Appends a module whose forward takes and returns one tensor, registered as "<index>".
  template <class M>
  void push_back(std::shared_ptr<M> block) {
    calls_.push_back([m = block.get()](const at::Tensor& x) { return m->forward(x); });
    modules_.push_back(register_module(std::to_string(modules_.size()), std::move(block)));
  }
  template <class M>
  void push_back(const torch::nn::ModuleHolder<M>& holder) {
    push_back(holder.ptr());
  }
  at::Tensor forward(const at::Tensor& x);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<torch::nn::Module>& ptr(size_t i) const { return modules_.at(i); }
  // Local: the wrapper of every block's call from now on (null: plain calls).
  void setAround(Around around) { around_ = std::move(around); }

 private:
  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  std::vector<Fn> calls_;
  Around around_;
};
TORCH_MODULE(Blocks);

}  // namespace tessera::nn
