// launch_probe: started by a real launcher (torchrun, mpirun, srun), it bootstraps through
// tessera::init(), checks an all-reduce, an all-gather and a barrier on the world
// communicator, and prints one line per rank:
//
//   PROBE launcher=pmix rank=1 world=3 local_rank=1 local_world=3 hosts_store=0 prefix=tessera/... ok
//
// On any failure it prints "PROBE FAILED rank=R: <error>" to stderr and exits 1.
// TESSERA_PROBE_FAIL_RANK=r makes rank r fail on purpose after init (tests that a failing rank
// fails the launch instead of hanging it).
// TESSERA_PROBE_WHERE=1 adds, before "ok", where the rank ran and whom it talked to (the
// multi-node tests under scripts/slurm-netns check these):
//   node=<SLURM_NODEID or -> host=<host name> host_ip=<its IPv4> store=<host>:<port>
//   store_ip=<its IPv4> tcp=<remote IPv4s of this process's established TCP connections>
#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "tessera/comm/bootstrap/init.h"
#include "common/env.h"
#include "tessera/common/error.h"

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
}

// The first IPv4 address `host` resolves to, "?" if none.
std::string ipv4(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (host.empty() || getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return "?";
  char buf[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

// Remote addresses of this process's established IPv4 TCP connections (its sockets' inodes
// matched against /proc/self/net/tcp), comma-separated and sorted; "-" if none.
std::string tcpPeers() {
  std::set<std::string> inodes, peers;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[64] = {0};
      std::string fd = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = readlink(fd.c_str(), target, sizeof(target) - 1);
      std::string t(target, n > 0 ? n : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(d);
  }
  std::ifstream tcp("/proc/self/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (st != "01" || !inodes.count(inode)) continue;  // 01: ESTABLISHED
    in_addr a{};
    a.s_addr = static_cast<uint32_t>(std::stoul(remote.substr(0, 8), nullptr, 16));
    char buf[INET_ADDRSTRLEN];
    peers.insert(inet_ntop(AF_INET, &a, buf, sizeof(buf)));
  }
  std::string out;
  for (const auto& p : peers) out += (out.empty() ? "" : ",") + p;
  return out.empty() ? "-" : out;
}

std::string where(const tessera::Context& ctx) {
  if (tessera::env::get("TESSERA_PROBE_WHERE").value_or("") != "1") return "";
  const auto& l = ctx.launch;
  return fmt::format("node={} host={} host_ip={} store={}:{} store_ip={} tcp={} ",
                     tessera::env::get("SLURM_NODEID").value_or("-"), ctx.hostname, ipv4(ctx.hostname), l.storeHost,
                     l.storePort, ipv4(l.storeHost), tcpPeers());
}

}  // namespace

int main() {
  int rank = -1;
  try {
    auto ctx = tessera::init();
    rank = ctx.launch.rank;
    probe(ctx);
    // This process's connections are listed before the last barrier: no peer can pass it, exit and
    // leave its sockets half closed (not ESTABLISHED) before this rank has entered it.
    const std::string at = where(ctx);
    ctx.world->barrier()->wait();
    const auto& l = ctx.launch;
    std::printf("PROBE launcher=%s rank=%d world=%d local_rank=%d local_world=%d hosts_store=%d prefix=%s %sok\n",
                l.launcher.c_str(), l.rank, l.worldSize, l.localRank, l.localWorldSize, l.hostsStore ? 1 : 0,
                l.storePrefix.c_str(), at.c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "PROBE FAILED rank=%d: %s\n", rank, e.what());
    std::fflush(stderr);
    return 1;
  }
}
