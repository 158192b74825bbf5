#include "comm/gloo/gloo_ops.h"

#include <ATen/ATen.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include "comm/watchdog/fingerprint.h"
#include "tessera/common/error.h"

namespace tessera::gloo_ops {
namespace {

using Func = void (*)(void*, const void*, const void*, size_t);

struct SumOp {
  template <typename T> static T apply(T a, T b) { return static_cast<T>(a + b); }
};
struct MaxOp {
  template <typename T> static T apply(T a, T b) { return b > a ? b : a; }
};
struct MinOp {
  template <typename T> static T apply(T a, T b) { return b < a ? b : a; }
};

// c = a (op) b elementwise; c may alias a. Half/BFloat16 go through float arithmetic.
template <typename T, typename Op>
void reduceFn(void* c, const void* a, const void* b, size_t n) {
  auto* C = static_cast<T*>(c);
  auto* A = static_cast<const T*>(a);
  auto* B = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) C[i] = Op::apply(A[i], B[i]);
}

template <typename T>
Func pick(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return &reduceFn<T, MaxOp>;
    case ReduceOp::Min: return &reduceFn<T, MinOp>;
    default: return &reduceFn<T, SumOp>;  // Sum, and Avg (divided afterwards)
  }
}

Func reduceFunc(c10::ScalarType t, ReduceOp op) {
  switch (t) {
    case at::kFloat: return pick<float>(op);
    case at::kBFloat16: return pick<c10::BFloat16>(op);
    case at::kHalf: return pick<c10::Half>(op);
    case at::kInt: return pick<int32_t>(op);
    case at::kLong: return pick<int64_t>(op);
    default: throw Error(fmt::format("gloo: unsupported dtype {}", c10::toString(t)));
  }
}

// Gloo's typed setters only need the element size; a byte-sized "element" type per width
// lets one code path serve every dtype.
template <size_t N> struct Bytes { char b[N]; };

template <typename F>
void withElementType(const at::Tensor& t, F&& f) {
  switch (t.element_size()) {
    case 2: f(Bytes<2>{}); break;
    case 4: f(Bytes<4>{}); break;
    case 8: f(Bytes<8>{}); break;
    default: throw Error(fmt::format("gloo: unsupported element size {}", t.element_size()));
  }
}

template <typename T> T* ptr(const at::Tensor& t) { return static_cast<T*>(t.data_ptr()); }

void finishAvg(const at::Tensor& t, ReduceOp op, int size) {
  if (op != ReduceOp::Avg) return;
  if (at::isIntegralType(t.scalar_type(), false)) {
    t.div_(size, "trunc");
  } else {
    t.div_(size);
  }
}

}  // namespace

void allReduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, ReduceOp op) {
  if (t.numel() == 0) return;
  withElementType(t, [&](auto e) {
    using T = decltype(e);
    gloo::AllreduceOptions o(c);
    o.setTimeout(timeout);
    o.setTag(tag);
    o.setOutput(ptr<T>(t), t.numel());
    o.setReduceFunction(reduceFunc(t.scalar_type(), op));
    gloo::allreduce(o);
  });
  finishAvg(t, op, c->size);
}

void broadcast(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root) {
  if (t.numel() == 0) return;
  withElementType(t, [&](auto e) {
    using T = decltype(e);
    gloo::BroadcastOptions o(c);
    o.setTimeout(timeout);
    o.setTag(tag);
    o.setRoot(root);
    o.setOutput(ptr<T>(t), t.numel());
    gloo::broadcast(o);
  });
}

void reduce(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& t, int root, ReduceOp op) {
  if (t.numel() == 0) return;
  // Gloo's reduce may use the output as scratch on non-root ranks; reduce a copy there so
  // that their tensor stays as it was (the documented contract).
  at::Tensor buf = c->rank == root ? t : t.clone();
  withElementType(buf, [&](auto e) {
    using T = decltype(e);
    gloo::ReduceOptions o(c);
    o.setTimeout(timeout);
    o.setTag(tag);
    o.setRoot(root);
    o.setOutput(ptr<T>(buf), buf.numel());
    o.setReduceFunction(reduceFunc(buf.scalar_type(), op));
    gloo::reduce(o);
  });
  if (c->rank == root) finishAvg(t, op, c->size);
}

namespace {
// Ops with one input and one output buffer (all-gather, all-to-all).
template <typename Options, typename Run>
void inOut(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in, Run&& run) {
  if (in.numel() == 0) return;
  withElementType(in, [&](auto e) {
    using T = decltype(e);
    Options o(c);
    o.setTimeout(timeout);
    o.setTag(tag);
    o.setInput(ptr<T>(in), in.numel());
    o.setOutput(ptr<T>(out), out.numel());
    run(o);
  });
}
}  // namespace

void allGather(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in) {
  inOut<gloo::AllgatherOptions>(c, timeout, tag, out, in, [](auto& o) { gloo::allgather(o); });
}

void allToAll(const Ctx& c, Ms timeout, uint32_t tag, const at::Tensor& out, const at::Tensor& in) {
  inOut<gloo::AlltoallOptions>(c, timeout, tag, out, in, [](auto& o) { gloo::alltoall(o); });
}

namespace {
constexpr size_t kHeaderWords = fingerprint::kWords + 1;  // the fingerprint, then the input's length or -1
}  // namespace

Preamble::Preamble(Ctx c, uint64_t slotBase) : c_(std::move(c)), base_(slotBase) {
  limit_ = c_->size <= 4 ? 16384 : (65536 / static_cast<size_t>(c_->size) + 7) / 8 * 8;
  stride_ = kHeaderWords * sizeof(int64_t) + limit_;
  for (auto& b : buf_) b.assign(stride_ / sizeof(int64_t) * c_->size, 0);
}

Preamble::~Preamble() {
  for (auto& u : ub_) u.reset();  // before the context they belong to
}

int Preamble::size() const { return c_->size; }
int Preamble::rank() const { return c_->rank; }

const char* Preamble::input(int r) const {
  return reinterpret_cast<const char*>(buf_[last_ % 2].data()) + r * stride_ + kHeaderWords * sizeof(int64_t);
}

bool Preamble::allInline() const {
  for (int r = 0; r < c_->size; ++r) {
    if (buf_[last_ % 2][r * stride_ / sizeof(int64_t) + fingerprint::kWords] < 0) return false;
  }
  return true;
}

void Preamble::post(uint64_t k) {
  auto& b = buf_[k % 2];
  auto& u = ub_[k % 2];
  u = c_->createUnboundBuffer(b.data(), b.size() * sizeof(int64_t));
  for (int p = 0; p < c_->size; ++p) {
    if (p != c_->rank) u->recv(p, base_ | k, p * stride_, stride_);  // a peer may send less
  }
  posted_ = k;
}

const int64_t* Preamble::run(uint64_t k, const int64_t* fingerprint, const void* in, size_t bytes, Ms timeout) {
  if (posted_ != k) post(k);
  last_ = k;
  auto* mine = buf_[k % 2].data() + c_->rank * stride_ / sizeof(int64_t);
  std::copy(fingerprint, fingerprint + fingerprint::kWords, mine);
  const bool along = bytes <= limit_;
  mine[fingerprint::kWords] = along ? static_cast<int64_t>(bytes) : -1;
  if (along && bytes > 0) std::memcpy(mine + kHeaderWords, in, bytes);
  auto& u = ub_[k % 2];
  const size_t sent = kHeaderWords * sizeof(int64_t) + (along ? bytes : 0);
  for (int p = 0; p < c_->size; ++p) {
    if (p != c_->rank) u->send(p, base_ | k, c_->rank * stride_, sent);
  }
  for (int m = 1; m < c_->size; ++m) {
    if (!u->waitRecv(timeout)) throw Error("gloo: the collective's preamble was aborted");
  }
  for (int m = 1; m < c_->size; ++m) {
    if (!u->waitSend(timeout)) throw Error("gloo: the collective's preamble was aborted");
  }
  try {  // into the other buffer: this round's stays readable until the next run()
    post(k + 1);
  } catch (const std::exception&) {  // a peer already gone after its last op: round k + 1 reports it, if run
    posted_ = 0;
  }
  std::vector<int64_t> words(fingerprint::kWords * static_cast<size_t>(c_->size));
  for (int r = 0; r < c_->size; ++r) {
    const auto* w = buf_[k % 2].data() + r * stride_ / sizeof(int64_t);
    std::copy(w, w + fingerprint::kWords, words.begin() + r * fingerprint::kWords);
  }
  words_ = std::move(words);
  return words_.data();
}

namespace {
// dst = the reduction of every rank's input from byte `offset`, in rank order.
void reduceInputs(const Preamble& p, void* dst, size_t offset, const at::Tensor& like, int64_t count, ReduceOp op) {
  auto fn = reduceFunc(like.scalar_type(), op);
  std::memcpy(dst, p.input(0) + offset, count * like.element_size());
  for (int r = 1; r < p.size(); ++r) fn(dst, dst, p.input(r) + offset, count);
}
}  // namespace

void inlineAllReduce(const Preamble& p, const at::Tensor& t, ReduceOp op) {
  reduceInputs(p, t.data_ptr(), 0, t, t.numel(), op);
  finishAvg(t, op, p.size());
}

void inlineBroadcast(const Preamble& p, const at::Tensor& t, int root) {
  std::memcpy(t.data_ptr(), p.input(root), t.nbytes());
}

void inlineReduce(const Preamble& p, const at::Tensor& t, int root, ReduceOp op) {
  if (p.rank() == root) inlineAllReduce(p, t, op);
}

void inlineAllGather(const Preamble& p, const at::Tensor& out) {
  const size_t each = out.nbytes() / p.size();
  for (int r = 0; r < p.size(); ++r) std::memcpy(static_cast<char*>(out.data_ptr()) + r * each, p.input(r), each);
}

void inlineReduceScatter(const Preamble& p, const at::Tensor& out, ReduceOp op) {
  reduceInputs(p, out.data_ptr(), p.rank() * out.nbytes(), out, out.numel(), op);
  finishAvg(out, op, p.size());
}

void inlineAllToAll(const Preamble& p, const at::Tensor& out) {
  const size_t chunk = out.nbytes() / p.size();
  for (int r = 0; r < p.size(); ++r) {
    std::memcpy(static_cast<char*>(out.data_ptr()) + r * chunk, p.input(r) + p.rank() * chunk, chunk);
  }
}

void barrier(const Ctx& c, Ms timeout, uint32_t tag) {
  gloo::BarrierOptions o(c);
  o.setTimeout(timeout);
  o.setTag(tag);
  gloo::barrier(o);
}

void batchP2P(const Ctx& c, Ms timeout, const std::vector<P2POp>& ops, const std::vector<uint64_t>& slots) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  bufs.reserve(ops.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    const auto& op = ops[k];
    auto bytes = static_cast<size_t>(op.tensor.numel()) * op.tensor.element_size();
    bufs.push_back(c->createUnboundBuffer(op.tensor.data_ptr(), bytes));
    if (op.kind == P2POp::Send) {
      bufs.back()->send(op.peer, slots[k]);
    } else {
      bufs.back()->recv(op.peer, slots[k]);
    }
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].kind == P2POp::Send) {
      bufs[k]->waitSend(timeout);
    } else {
      bufs[k]->waitRecv(timeout);
    }
  }
}

}  // namespace tessera::gloo_ops
