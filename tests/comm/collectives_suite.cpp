#include "comm/collectives_suite.h"

#include "comm/collective_check.h"
#include "harness/multiprocess.h"

namespace tessera::testing {
namespace {

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  double d = maxAbsDiff(got, want);
  // Every value in these tests is exactly representable and every reduction order gives
  // the same result, so the answer must be exact (avg: one rounding of an exact sum).
  WCHECK(d == 0.0, "{}: max |got - want| = {} (got {} ... want {} ...)", what, d,
         str(got.cpu().to(at::kDouble).flatten().slice(0, 0, 8)),
         str(want.cpu().to(at::kDouble).flatten().slice(0, 0, 8)));
}

at::Tensor expectedReduce(const std::string& op, int n, int64_t numel, c10::ScalarType dt, int64_t offset = 0) {
  auto out = at::empty({numel}, at::kDouble);
  for (int64_t i = 0; i < numel; ++i) out[i] = reduceExpect(op, n, offset + i, isIntegral(dt));
  return out.to(dt).to(at::kDouble);  // rounded to the dtype as the communicator must
}

void checkAllReduce(Communicator& c, const at::TensorOptions& o, c10::ScalarType dt, int64_t n) {
  const std::pair<const char*, ReduceOp> ops[] = {
      {"sum", ReduceOp::Sum}, {"avg", ReduceOp::Avg}, {"max", ReduceOp::Max}, {"min", ReduceOp::Min}};
  for (auto [name, op] : ops) {
    auto t = rankInput(c.rank(), n, dt).to(o.device());
    c.allReduce(t, op)->synchronize();
    expectClose(t, expectedReduce(name, c.size(), n, dt), fmt::format("all_reduce {} {} n={}", name, dtypeName(dt), n));
  }
}

void checkRooted(Communicator& c, const at::TensorOptions& o, c10::ScalarType dt, int64_t n) {
  int root = c.size() - 1;
  auto b = rankInput(c.rank(), n, dt).to(o.device());
  c.broadcast(b, root)->synchronize();
  expectClose(b, rankInput(root, n, dt), fmt::format("broadcast {} n={}", dtypeName(dt), n));

  auto r = rankInput(c.rank(), n, dt).to(o.device());
  c.reduce(r, 0, ReduceOp::Sum)->synchronize();
  auto want = c.rank() == 0 ? expectedReduce("sum", c.size(), n, dt) : rankInput(c.rank(), n, dt);
  expectClose(r, want, fmt::format("reduce {} n={} (rank {})", dtypeName(dt), n, c.rank()));
}

void checkGatherScatter(Communicator& c, const at::TensorOptions& o, c10::ScalarType dt, int64_t n) {
  int w = c.size();
  auto in = rankInput(c.rank(), n, dt).to(o.device());
  auto out = at::full({w * n}, -7, o.dtype(dt));
  c.allGather(out, in)->synchronize();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < w; ++r) parts.push_back(rankInput(r, n, dt));
  expectClose(out, at::cat(parts), fmt::format("all_gather {} n={}", dtypeName(dt), n));

  auto big = rankInput(c.rank(), w * n, dt).to(o.device());
  auto mine = at::full({n}, -7, o.dtype(dt));
  c.reduceScatter(mine, big, ReduceOp::Sum)->synchronize();
  expectClose(mine, expectedReduce("sum", w, n, dt, c.rank() * n),
              fmt::format("reduce_scatter {} n={}", dtypeName(dt), n));
  expectClose(big, rankInput(c.rank(), w * n, dt), "reduce_scatter left its input unchanged");

  // all-to-all: chunk j of rank i's input lands in chunk i of rank j's output. Rank r's
  // input is rankInput(r) offset by 1000*r so every chunk is distinguishable (rounded to
  // bf16/fp16 on both sides: all-to-all only moves bytes, so the comparison stays exact).
  auto a2aIn = (rankInput(c.rank(), w * n, dt).to(at::kDouble) + 1000 * c.rank()).to(dt).to(o.device());
  auto a2aOut = at::full({w * n}, -7, o.dtype(dt));
  c.allToAll(a2aOut, a2aIn)->synchronize();
  std::vector<at::Tensor> want;
  for (int src = 0; src < w; ++src) {
    auto srcIn = (rankInput(src, w * n, dt).to(at::kDouble) + 1000 * src).to(dt);
    want.push_back(srcIn.slice(0, c.rank() * n, (c.rank() + 1) * n));
  }
  expectClose(a2aOut, at::cat(want), fmt::format("all_to_all {} n={}", dtypeName(dt), n));
}

void checkP2P(Communicator& c, const at::TensorOptions& o, c10::ScalarType dt, int64_t n) {
  int w = c.size();
  if (w < 2) return;
  int next = (c.rank() + 1) % w, prev = (c.rank() + w - 1) % w;
  auto s = rankInput(c.rank(), n, dt).to(o.device());
  auto r = at::full({n}, -7, o.dtype(dt));
  c.batchP2P({{P2POp::Send, s, next}, {P2POp::Recv, r, prev}})->synchronize();
  expectClose(r, rankInput(prev, n, dt), fmt::format("batch_p2p ring {} n={}", dtypeName(dt), n));
  // Plain send/recv between ranks 0 and 1, twice in a row (ordering by issue order).
  if (c.rank() <= 1) {
    int peer = 1 - c.rank();
    auto a = rankInput(c.rank(), n, dt).to(o.device());
    auto b = (rankInput(c.rank(), n, dt).to(at::kDouble) * 2).to(dt).to(o.device());
    auto ra = at::full({n}, -7, o.dtype(dt)), rb = at::full({n}, -7, o.dtype(dt));
    if (c.rank() == 0) {
      c.send(a, peer);
      c.send(b, peer)->synchronize();
      c.recv(ra, peer)->synchronize();
      expectClose(ra, rankInput(peer, n, dt), "recv from 1");
    } else {
      c.recv(ra, peer);
      c.recv(rb, peer)->synchronize();
      expectClose(ra, rankInput(peer, n, dt), "first recv from 0");
      expectClose(rb, (rankInput(peer, n, dt).to(at::kDouble) * 2).to(dt), "second recv from 0");
      c.send(a, peer)->synchronize();
    }
  }
}

}  // namespace

void runCollectiveSuite(Communicator& comm, const at::TensorOptions& opts) {
  for (auto dt : allDtypes()) {
    for (auto n : oddSizes()) {
      checkAllReduce(comm, opts, dt, n);
      checkRooted(comm, opts, dt, n);
      checkGatherScatter(comm, opts, dt, n);
      checkP2P(comm, opts, dt, n);
    }
  }
  comm.barrier()->synchronize();
}

}  // namespace tessera::testing
