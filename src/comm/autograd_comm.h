#pragma once
// A communicator carried in an autograd context (custom autograd functions whose backward
// communicates): saved under `key` in forward, read back in backward. Local; no global topology.
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "tessera/comm/communicator.h"

namespace tessera::autograd_comm {

struct Holder : torch::CustomClassHolder {
  explicit Holder(CommPtr c) : comm(std::move(c)) {}
  CommPtr comm;
};

inline void save(torch::autograd::AutogradContext* ctx, const CommPtr& c, const std::string& key = "comm") {
  ctx->saved_data[key] = c10::IValue::make_capsule(c10::make_intrusive<Holder>(c));
}

inline CommPtr load(torch::autograd::AutogradContext* ctx, const std::string& key = "comm") {
  return c10::static_intrusive_pointer_cast<Holder>(ctx->saved_data[key].toCapsule())->comm;
}

}  // namespace tessera::autograd_comm
