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
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace tessera::gloo_ops {

using Ctx = std::shared_ptr<gloo::Context>;
using Ms = std::chrono::milliseconds;

void allReduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, ReduceOp op);
void broadcast(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root);
void reduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root, ReduceOp op);
void allGather(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in);
void allToAll(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in);
void barrier(const Ctx& c, Ms timeout, uint32_t tag);
// Every collective's first message when fingerprints are on (comm/watchdog/fingerprint.h): each
// rank sends every peer at once its call's fingerprint and, when it fits inlineLimit(), the op's
// input. When every rank's input came along, the inline*() functions below compute the op from them:
// a small collective costs one message latency, the check nothing more. Round k (the op's seq) uses
// slot `slotBase` | k; the receives of round k + 1 are posted when round k ends, so a peer's message
// goes out the moment it sends it. One thread at a time (the communicator's worker).
class Preamble {
 public:
  Preamble(Ctx c, uint64_t slotBase);
  ~Preamble();
  // Bytes of input sent along: 16 KiB, 64 KiB / size in groups of more than 4.
  size_t inlineLimit() const { return limit_; }
  // Round k: returns every rank's fingerprint (fingerprint::kWords each, in rank order); `in` goes
  // along when `bytes` <= inlineLimit().
  const int64_t* run(uint64_t k, const int64_t* fingerprint, const void* in, size_t bytes, Ms timeout);
  // After run(): whether every rank's input came along; rank r's input.
  bool allInline() const;
  const char* input(int r) const;
  int size() const;
  int rank() const;

 private:
  void post(uint64_t k);  // the receives of round k, into buffer k % 2

  Ctx c_;
  uint64_t base_;
  size_t limit_, stride_;  // stride_: bytes per rank (fingerprint, input length or -1, input)
  std::vector<int64_t> buf_[2];
  std::unique_ptr<gloo::transport::UnboundBuffer> ub_[2];
  uint64_t posted_ = 0, last_ = 0;  // the round whose receives are posted; the last round run
  std::vector<int64_t> words_;       // the last round's fingerprints
};

// The ops from the inputs of the last round of `p` (allInline()), each rank's in rank order, with
// the results and contracts of the functions above.
void inlineAllReduce(const Preamble& p, const at::Tensor& t, ReduceOp op);
void inlineBroadcast(const Preamble& p, const at::Tensor& t, int root);
void inlineReduce(const Preamble& p, const at::Tensor& t, int root, ReduceOp op);
void inlineAllGather(const Preamble& p, const at::Tensor& out);
void inlineReduceScatter(const Preamble& p, const at::Tensor& out, ReduceOp op);
void inlineAllToAll(const Preamble& p, const at::Tensor& out);
// Posts every op, then waits for all of them. slots[i] pairs ops[i] with the peer's op.
void batchP2P(const Ctx& c, Ms timeout, const std::vector<P2POp>& ops, const std::vector<uint64_t>& slots);

}  // namespace tessera::gloo_ops
