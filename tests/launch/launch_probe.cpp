// launch_probe: started by a real launcher (torchrun, mpirun, srun), it bootstraps through
// tessera::init(), checks an all-reduce, an all-gather and a barrier on the world
// communicator, and prints one line per rank:
//
//   PROBE launcher=pmix rank=1 world=3 local_rank=1 local_world=3 hosts_store=0 prefix=tessera/... ok
//
// On any failure it prints "PROBE FAILED rank=R: <error>" to stderr and exits 1.
// TESSERA_PROBE_FAIL_RANK=r makes rank r fail on purpose after init (tests that a failing rank
// fails the launch instead of hanging it).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "comm/bootstrap/init.h"
#include "common/env.h"
#include "common/error.h"

namespace {

void probe(const tessera::Context& ctx) {
  const auto& l = ctx.launch;
  const auto& world = ctx.world;
  const int n = world->size(), r = world->rank();
  TESSERA_CHECK(n == l.worldSize && r == l.rank, "rank {}: communicator says rank {} of {}, launcher said {} of {}", r,
                r, n, l.rank, l.worldSize);
  if (auto bad = tessera::env::getInt("TESSERA_PROBE_FAIL_RANK"); bad && *bad == r)
    throw tessera::Error(fmt::format("rank {}: failing on purpose (TESSERA_PROBE_FAIL_RANK={})", r, *bad));

  auto opts = at::TensorOptions().dtype(at::kLong).device(ctx.device);  // CUDA under NCCL
  auto sum = at::full({3}, r + 1, opts);
  world->allReduce(sum)->wait();
  const long long want = 1LL * n * (n + 1) / 2;
  for (int i = 0; i < 3; ++i) {
    long long got = sum[i].item<int64_t>();
    TESSERA_CHECK(got == want, "rank {}: all-reduce of rank+1 gave {} at [{}], want n(n+1)/2 = {}", r, got, i, want);
  }

  auto gathered = at::full({n}, -1, opts);
  world->allGather(gathered, at::full({1}, r, opts))->wait();
  for (int i = 0; i < n; ++i) {
    long long got = gathered[i].item<int64_t>();
    TESSERA_CHECK(got == i, "rank {}: all-gather of ranks gave {} at [{}], want {}", r, got, i, i);
  }

  world->barrier()->wait();
}

}  // namespace

int main() {
  int rank = -1;
  try {
    auto ctx = tessera::init();
    rank = ctx.launch.rank;
    probe(ctx);
    const auto& l = ctx.launch;
    std::printf("PROBE launcher=%s rank=%d world=%d local_rank=%d local_world=%d hosts_store=%d prefix=%s ok\n",
                l.launcher.c_str(), l.rank, l.worldSize, l.localRank, l.localWorldSize, l.hostsStore ? 1 : 0,
                l.storePrefix.c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "PROBE FAILED rank=%d: %s\n", rank, e.what());
    std::fflush(stderr);
    return 1;
  }
}
