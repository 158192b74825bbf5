#pragma once
// The gloo calls behind GlooCommunicator, one function per op. Each blocks until the op is
// done on this rank and throws (gloo's own exception) on failure or timeout. `tag` must be
// equal on every rank for the same collective.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <vector>

#include "tessera/comm/types.h"

namespace gloo {
class Context;
}

namespace tessera::gloo_ops {

using Ctx = std::shared_ptr<gloo::Context>;
using Ms = std::chrono::milliseconds;

void allReduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, ReduceOp op);
void broadcast(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root);
void reduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root, ReduceOp op);
void allGather(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in);
void allToAll(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in);
void barrier(const Ctx& c, Ms timeout, uint32_t tag);
// Posts every op, then waits for all of them. slots[i] pairs ops[i] with the peer's op.
void batchP2P(const Ctx& c, Ms timeout, const std::vector<P2POp>& ops, const std::vector<uint64_t>& slots);

}  // namespace tessera::gloo_ops
