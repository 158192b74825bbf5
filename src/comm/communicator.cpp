#include "tessera/comm/communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "comm/watchdog/fingerprint.h"
#include "comm/watchdog/flight_recorder.h"
#include "comm/watchdog/watchdog.h"
#include "tessera/common/error.h"

namespace tessera {

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* toString(Backend b) { return b == Backend::Gloo ? "gloo" : "nccl"; }

std::string dtypeName(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

bool isFloatingDtype(c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

bool isSupportedDtype(c10::ScalarType t) { return isFloatingDtype(t) || t == at::kInt || t == at::kLong; }

std::string OpInfo::describe() const {
  return fmt::format("{} #{} on group '{}' (rank {} of {}{}{})", op, seq, group, rank, groupSize,
                     detail.empty() ? "" : ", ", detail);
}

namespace {
std::string shapeDetail(const at::Tensor& t) {
  return t.defined() ? fmt::format("{} x {}", t.numel(), dtypeName(t.scalar_type())) : "undefined";
}

// The call's fingerprint, which the backend compares across the group before the op (fingerprint.h).
void stamp(bool on, OpInfo& i, fingerprint::Op op, const at::Tensor& t, int reduce = -1, int root = -1) {
  if (on) i.fingerprint = fingerprint::make(op, i.seq, t, reduce, root);
}
}  // namespace

Communicator::Communicator(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_(kDefaultTimeout),
      fingerprints_(fingerprint::mode() == fingerprint::Mode::Fingerprint) {
  TESSERA_CHECK(size > 0 && rank >= 0 && rank < size, "communicator '{}': rank {} is not in [0, {})", name_, rank,
                size);
}

void Communicator::setSideChannel(StorePtr store, std::string ns) {
  sideStore_ = std::move(store);
  sideNs_ = std::move(ns);
  if (sideStore_ && fingerprint::enabled()) fingerprint::join(sideStore_, sideNs_, rank_);
}

template <typename F>
WorkPtr Communicator::run(const OpInfo& i, F&& launch) {
  if (i.seq > 0 && fingerprint::enabled()) {
    TESSERA_CHECK(sideStore_, "{}: debug mode (TESSERA_DEBUG=detail) needs the rendezvous store, which this communicator lacks",
                  i.describe());
    fingerprint::check(sideStore_, sideNs_, i, timeout_);
  }
  WorkPtr w = launch();
  if (!tracked_.exchange(true)) {
    if (auto self = weak_from_this().lock()) watchdog::track(self);
  }
  FlightRecorder::instance().record(this, i, w);
  return w;
}

OpInfo Communicator::nextOp(const char* op, std::string detail) {
  OpInfo i;
  i.op = op;
  i.group = name_;
  i.seq = ++seq_;
  i.rank = rank_;
  i.groupSize = size_;
  i.detail = std::move(detail);
  return i;
}

void Communicator::checkTensor(const OpInfo& i, const char* what, const at::Tensor& t) const {
  TESSERA_CHECK(t.defined(), "{}: {} tensor is undefined", i.describe(), what);
  checkDevice(i, what, t);
  TESSERA_CHECK(t.is_contiguous(), "{}: {} tensor (sizes {}) is not contiguous", i.describe(), what,
                fmt::format("{}", fmt::join(t.sizes(), "x")));
  TESSERA_CHECK(isSupportedDtype(t.scalar_type()),
                "{}: {} tensor has dtype {}; supported: float32, bfloat16, float16, int32, int64", i.describe(), what,
                dtypeName(t.scalar_type()));
}

void Communicator::checkPeer(const OpInfo& i, int peer) const {
  TESSERA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{}: peer rank {} is invalid (group of {}, self {})",
                i.describe(), peer, size_, rank_);
}

static void checkSameDtype(const OpInfo& i, const at::Tensor& out, const at::Tensor& in) {
  TESSERA_CHECK(out.scalar_type() == in.scalar_type(), "{}: output dtype {} differs from input dtype {}", i.describe(),
                dtypeName(out.scalar_type()), dtypeName(in.scalar_type()));
}

WorkPtr Communicator::allReduce(const at::Tensor& t, ReduceOp op) {
  auto i = nextOp("all_reduce", fmt::format("{}, {}", shapeDetail(t), toString(op)));
  checkTensor(i, "input", t);
  stamp(fingerprints_, i, fingerprint::kAllReduce, t, static_cast<int>(op));
  return run(i, [&] { return doAllReduce(i, t, op); });
}

WorkPtr Communicator::broadcast(const at::Tensor& t, int root) {
  auto i = nextOp("broadcast", fmt::format("{}, root {}", shapeDetail(t), root));
  checkTensor(i, "input", t);
  TESSERA_CHECK(root >= 0 && root < size_, "{}: root {} is not a rank of the group", i.describe(), root);
  stamp(fingerprints_, i, fingerprint::kBroadcast, t, -1, root);
  return run(i, [&] { return doBroadcast(i, t, root); });
}

WorkPtr Communicator::reduce(const at::Tensor& t, int root, ReduceOp op) {
  auto i = nextOp("reduce", fmt::format("{}, {}, root {}", shapeDetail(t), toString(op), root));
  checkTensor(i, "input", t);
  TESSERA_CHECK(root >= 0 && root < size_, "{}: root {} is not a rank of the group", i.describe(), root);
  stamp(fingerprints_, i, fingerprint::kReduce, t, static_cast<int>(op), root);
  return run(i, [&] { return doReduce(i, t, root, op); });
}

WorkPtr Communicator::allGather(const at::Tensor& out, const at::Tensor& in, Keep keep) {
  auto i = nextOp("all_gather", shapeDetail(in));
  i.keep = keep;
  checkTensor(i, "input", in);
  checkTensor(i, "output", out);
  checkSameDtype(i, out, in);
  TESSERA_CHECK(out.numel() == in.numel() * size_,
                "{}: output has {} elements, expected group size {} x input's {} = {}", i.describe(), out.numel(),
                size_, in.numel(), in.numel() * size_);
  stamp(fingerprints_, i, fingerprint::kAllGather, in);
  return run(i, [&] { return doAllGather(i, out, in); });
}

WorkPtr Communicator::reduceScatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op, Keep keep) {
  auto i = nextOp("reduce_scatter", fmt::format("{}, {}", shapeDetail(in), toString(op)));
  i.keep = keep;
  checkTensor(i, "input", in);
  checkTensor(i, "output", out);
  checkSameDtype(i, out, in);
  TESSERA_CHECK(in.numel() == out.numel() * size_,
                "{}: input has {} elements, expected group size {} x output's {} = {} (input numel must be divisible "
                "by the group size)",
                i.describe(), in.numel(), size_, out.numel(), out.numel() * size_);
  stamp(fingerprints_, i, fingerprint::kReduceScatter, in, static_cast<int>(op));
  return run(i, [&] { return doReduceScatter(i, out, in, op); });
}

WorkPtr Communicator::allToAll(const at::Tensor& out, const at::Tensor& in) {
  auto i = nextOp("all_to_all", shapeDetail(in));
  checkTensor(i, "input", in);
  checkTensor(i, "output", out);
  checkSameDtype(i, out, in);
  TESSERA_CHECK(in.numel() == out.numel(), "{}: output has {} elements, input {}; they must be equal", i.describe(),
                out.numel(), in.numel());
  TESSERA_CHECK(in.numel() % size_ == 0, "{}: {} elements are not divisible by the group size {}", i.describe(),
                in.numel(), size_);
  stamp(fingerprints_, i, fingerprint::kAllToAll, in);
  return run(i, [&] { return doAllToAll(i, out, in); });
}

WorkPtr Communicator::send(const at::Tensor& t, int peer) { return batchP2P({P2POp{P2POp::Send, t, peer}}); }

WorkPtr Communicator::recv(const at::Tensor& t, int peer) { return batchP2P({P2POp{P2POp::Recv, t, peer}}); }

WorkPtr Communicator::batchP2P(const std::vector<P2POp>& ops) {
  std::string detail;
  for (const auto& o : ops) {
    detail += fmt::format("{}{} {} {} {}", detail.empty() ? "" : "; ", o.kind == P2POp::Send ? "send" : "recv",
                          shapeDetail(o.tensor), o.kind == P2POp::Send ? "to" : "from", o.peer);
  }
  // Point-to-point ops are not collective: they do not consume a collective sequence number
  // on ranks that do not take part, so they carry seq 0 and are named by their peers.
  OpInfo i;
  i.op = ops.size() == 1 ? (ops[0].kind == P2POp::Send ? "send" : "recv") : "batch_p2p";
  i.group = name_;
  i.rank = rank_;
  i.groupSize = size_;
  i.detail = detail;
  TESSERA_CHECK(!ops.empty(), "{}: no operations given", i.describe());
  for (const auto& o : ops) {
    checkTensor(i, o.kind == P2POp::Send ? "send" : "recv", o.tensor);
    checkPeer(i, o.peer);
  }
  return run(i, [&] { return doBatchP2P(i, ops); });
}

WorkPtr Communicator::barrier() {
  auto i = nextOp("barrier", "");
  stamp(fingerprints_, i, fingerprint::kBarrier, at::Tensor());
  return run(i, [&] { return doBarrier(i); });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  auto mine = at::tensor(std::vector<int64_t>{color, key}, at::TensorOptions().dtype(at::kLong))
                  .to(scratchOptions().dtype(at::kLong));
  auto all = at::empty({2 * size_}, scratchOptions().dtype(at::kLong));
  allGather(all, mine)->synchronize();
  auto cpu = all.cpu();
  auto* v = cpu.data_ptr<int64_t>();
  std::string tag = fmt::format("{}/split{}", name_, ++splits_);
  std::vector<std::pair<int64_t, int>> order;  // (key, old rank) of my color; empty when color < 0
  for (int r = 0; color >= 0 && r < size_; ++r) {
    if (v[2 * r] == color) order.emplace_back(v[2 * r + 1], r);
  }
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (auto& kv : order) members.push_back(kv.second);
  auto child = doSplit(color, members, name, fmt::format("{}/c{}", tag, color));
  if (child) {
    child->setSideChannel(sideStore_, fmt::format("{}/s{}/c{}", sideNs_, splits_, color));
    child->tracked_ = true;
    watchdog::track(child);
  }
  return child;
}

}  // namespace tessera
