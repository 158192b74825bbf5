// collectives_demo: the main job until the trainer exists. Bootstraps through tessera::init()
// (torchrun, PMIx, SLURM), builds a ProcessMesh (dp × 1 × 2 when the world is even, e.g.
// 2×1×2 for 4 ranks), runs every collective on the world and on the mesh's groups, checks
// each result against its hand-computed value on every rank, and prints them on rank 0.
// Exits 1 with the error on any mismatch or communication failure.
//
//   torchrun -r 1 -t 1 --nproc_per_node=4 --no_python build/examples/collectives_demo
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/common/error.h"
#include "tessera/parallel/process_mesh.h"

namespace {

using tessera::ReduceOp;

std::vector<double> values(const at::Tensor& t) {
  auto c = t.detach().to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

struct Demo {
  tessera::Context& ctx;
  int rank, n;
  at::TensorOptions f32;

  explicit Demo(tessera::Context& c)
      : ctx(c), rank(c.world->rank()), n(c.world->size()), f32(at::TensorOptions().dtype(at::kFloat).device(c.device)) {}

  // Checks `got` against `want` on this rank; rank 0 prints the line.
  void report(const std::string& what, const at::Tensor& got, const std::vector<double>& want, double ms) {
    auto v = values(got);
    bool ok = v.size() == want.size();
    for (size_t i = 0; ok && i < v.size(); ++i) ok = std::abs(v[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i]));
    TESSERA_CHECK(ok, "collectives_demo: {} on rank {} gave [{}], expected [{}]", what, rank, fmt::join(v, ", "),
                  fmt::join(want, ", "));
    if (rank == 0) fmt::print("  {:<36} [{}]  ok  ({:.2f} ms)\n", what, fmt::join(v, ", "), ms);
  }

  template <typename F>
  double timed(F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    f()->synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void world() {
    auto& w = ctx.world;
    const double tri = n * (n + 1) / 2.0;
    for (auto [op, name, want] : {std::tuple{ReduceOp::Sum, "sum", tri}, std::tuple{ReduceOp::Avg, "avg", tri / n},
                                  std::tuple{ReduceOp::Max, "max", double(n)}, std::tuple{ReduceOp::Min, "min", 1.0}}) {
      auto t = at::full({4}, rank + 1, f32);
      double ms = timed([&] { return w->allReduce(t, op); });
      report(fmt::format("all_reduce({}) of rank+1", name), t, std::vector<double>(4, want), ms);
    }
    {
      auto t = at::arange(6, f32) + rank;  // element k of rank q: k + q
      double ms = timed([&] { return w->allReduce(t, ReduceOp::Sum); });
      std::vector<double> want;
      for (int k = 0; k < 6; ++k) want.push_back(n * k + n * (n - 1) / 2.0);
      report("all_reduce(sum) of arange+rank", t, want, ms);
    }
    {
      auto t = at::arange(3, f32) + 100 * rank;
      double ms = timed([&] { return w->broadcast(t, n - 1); });
      report(fmt::format("broadcast from rank {}", n - 1), t, {100.0 * (n - 1), 100.0 * (n - 1) + 1, 100.0 * (n - 1) + 2}, ms);
    }
    {
      auto t = at::full({2}, rank + 1, f32);
      double ms = timed([&] { return w->reduce(t, 0, ReduceOp::Sum); });
      report("reduce(sum) of rank+1 to rank 0", t, std::vector<double>(2, rank == 0 ? tri : rank + 1), ms);
    }
    {
      auto out = at::empty({2 * n}, f32);
      double ms = timed([&] { return w->allGather(out, at::full({2}, rank, f32)); });
      std::vector<double> want;
      for (int i = 0; i < n; ++i) want.insert(want.end(), {double(i), double(i)});
      report("all_gather of [rank, rank]", out, want, ms);
    }
    {
      auto in = at::arange(2 * n, f32) + rank;  // rank q's element k: k + q
      auto out = at::empty({2}, f32);
      double ms = timed([&] { return w->reduceScatter(out, in, ReduceOp::Sum); });
      const double ranks = n * (n - 1) / 2.0;
      report("reduce_scatter(sum) of arange+rank", out, {n * (2.0 * rank) + ranks, n * (2.0 * rank + 1) + ranks}, ms);
    }
    {
      auto in = at::arange(n, f32) + 10 * rank;  // chunk j of rank i: 10 i + j
      auto out = at::empty({n}, f32);
      double ms = timed([&] { return w->allToAll(out, in); });
      std::vector<double> want;
      for (int i = 0; i < n; ++i) want.push_back(10.0 * i + rank);
      report("all_to_all of 10*rank + j", out, want, ms);
    }
    if (n > 1) {
      auto send = at::full({2}, rank, f32), recv = at::empty({2}, f32);
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      double ms = timed([&] {
        return w->batchP2P({{tessera::P2POp::Send, send, next}, {tessera::P2POp::Recv, recv, prev}});
      });
      report("send to rank+1 / recv from rank-1", recv, {double(prev), double(prev)}, ms);
    }
    double ms = timed([&] { return w->barrier(); });
    if (rank == 0) fmt::print("  {:<36} ok  ({:.2f} ms)\n", "barrier", ms);
  }

  void mesh(const tessera::ProcessMesh& m) {
    auto tpRanks = m.groupRanks(tessera::MeshAxis::Tensor);
    auto t = at::full({2}, rank, f32);
    double ms = timed([&] { return m.tpGroup()->allReduce(t, ReduceOp::Sum); });
    double sum = 0;
    for (int r : tpRanks) sum += r;
    report(fmt::format("tp all_reduce(sum) over {}", fmt::join(tpRanks, ",")), t, {sum, sum}, ms);

    auto dpRanks = m.groupRanks(tessera::MeshAxis::Data);
    auto out = at::empty({static_cast<long>(dpRanks.size())}, f32);
    ms = timed([&] { return m.dpGroup()->allGather(out, at::full({1}, rank, f32)); });
    report(fmt::format("dp all_gather over {}", fmt::join(dpRanks, ",")), out,
           std::vector<double>(dpRanks.begin(), dpRanks.end()), ms);
  }
};

}  // namespace

int main() {
  int rank = -1;
  try {
    auto ctx = tessera::init();
    rank = ctx.launch.rank;
    const int n = ctx.world->size();
    const int tp = n % 2 == 0 ? 2 : 1;
    Demo demo(ctx);
    if (rank == 0)
      fmt::print("tessera collectives demo: {} ranks via {}, backend {}, device {}\nworld:\n", n, ctx.launch.launcher,
                 tessera::toString(ctx.world->backend()), ctx.deviceDescription);
    demo.world();
    tessera::ProcessMesh mesh(ctx.world, n / tp, 1, tp);
    if (rank == 0) fmt::print("mesh {}:\n", mesh.describe());
    demo.mesh(mesh);
    ctx.world->barrier()->synchronize();
    if (rank == 0) fmt::print("collectives demo: all checks passed on {} ranks\n", n);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "collectives_demo failed on rank %d: %s\n", rank, e.what());
    tessera::publishFatal(e);  // the other ranks name this rank and its error as the cause
    return 1;
  }
}
