#include "tessera/comm/bootstrap/init.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>

#include <signal.h>
#include <unistd.h>

#include "tessera/comm/backends.h"
#include "comm/bootstrap/job.h"
#include "comm/watchdog/board.h"
#include "common/host.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera {
namespace {

LaunchInfo explicitLaunch(const InitOptions& o) {
  LaunchInfo l;
  l.launcher = o.launcher;
  l.rank = *o.rank;
  l.worldSize = *o.worldSize;
  l.localRank = o.localRank.value_or(l.rank);
  l.localWorldSize = o.localWorldSize.value_or(l.worldSize);
  l.storePrefix = o.storePrefix;
  l.ownStore = !o.store && o.rank0HostsStore;
  if (o.store) {
    l.store = o.store;
    l.storeName = o.storeName.empty() ? "the given store" : o.storeName;
    return l;
  }
  TESSERA_CHECK(o.storePort, "tessera::init: explicit rank/worldSize given but no storePort (nor a store)");
  l.storeHost = o.storeHost;
  l.storePort = *o.storePort;
  l.hostsStore = o.rank0HostsStore && l.rank == 0;
  return l;
}

LaunchInfo detect(const InitOptions& o) {
  if (o.rank || o.worldSize) {
    TESSERA_CHECK(o.rank && o.worldSize, "tessera::init: give both rank and worldSize, or neither");
    return explicitLaunch(o);
  }
  if (auto l = detectTorchrun()) return *l;
  if (auto l = detectPmix()) return *l;
  if (auto l = detectSlurm()) return *l;
  throw Error(
      "tessera::init: no launcher found: set rank/worldSize explicitly, or start under torchrun (RANK, WORLD_SIZE, "
      "MASTER_ADDR, MASTER_PORT), PMIx (srun --mpi=pmix, mpirun) or SLURM (SLURM_PROCID, SLURM_NTASKS)");
}

Backend chooseBackend(const InitOptions& o, const Settings& s, int devices) {
  if (s.backend) return *s.backend;
  if (o.backend) return *o.backend;
  return (ncclAvailable() && devices > 0) ? Backend::Nccl : Backend::Gloo;
}

// Rethrows the current tessera::Error / CommError (same type) with `where` in front.
[[noreturn]] void rethrowWith(const std::string& where) {
  try {
    throw;
  } catch (const CommError& e) {
    throw CommError(where + e.what());
  } catch (const Error& e) {
    throw Error(where + e.what());
  } catch (const std::exception& e) {
    throw Error(where + e.what());
  }
}

}  // namespace

std::string describeStore(const LaunchInfo& l) {
  std::string s;
  if (l.store && !l.storeName.empty()) {
    s = l.storeName;
  } else if (l.hostsStore) {
    s = fmt::format("store server on port {} (multi-tenant)", l.storePort);
  } else {
    s = fmt::format("store client of {}:{}", l.storeHost, l.storePort);
  }
  return fmt::format("{}, keys under '{}'", s, l.storePrefix);
}

CommPtr makeWorldCommunicator(Backend backend, const StorePtr& store, int rank, int worldSize,
                              const at::Device& device, std::chrono::milliseconds timeout) {
  if (backend == Backend::Nccl) {
    TESSERA_CHECK(ncclAvailable(), "tessera: NCCL backend requested but tessera was built without NCCL");
    TESSERA_CHECK(device.is_cuda(), "tessera: NCCL backend requested on rank {} but no CUDA device is visible", rank);
    return makeNcclCommunicator(store, rank, worldSize, device.index(), "world", timeout);
  }
  TESSERA_CHECK(glooAvailable(), "tessera: Gloo backend requested but tessera was built without Gloo");
  return makeGlooCommunicator(store, rank, worldSize, "world", timeout);
}

namespace {
std::terminate_handler previousTerminate = nullptr;

// An exception that escapes a library's own thread (seen: LibTorch 1.13's TCPStore client thread
// when the store's host dies during start-up, "Connection reset by peer") would end the process
// with std::abort and a bare "terminate called": name it and exit 1 like any other failure.
[[noreturn]] void terminateWithMessage() {
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "tessera: fatal: uncaught exception in a thread (a peer or the rendezvous store may have "
                           "gone away): %s\n", ex.what());
      std::fflush(stderr);
      board::publishFatal(ex);
    } catch (...) {
      std::fprintf(stderr, "tessera: fatal: uncaught exception of an unknown type in a thread\n");
    }
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (previousTerminate) previousTerminate();
  std::abort();
}
}  // namespace

void publishFatal(const std::exception& e) { board::publishFatal(e); }

Context init(const InitOptions& o) {
  // A peer that dies leaves sockets (store, Gloo) that fail on write; with SIGPIPE's default
  // action that write would kill this process silently instead of raising a clear error.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  static std::once_flag terminateOnce;
  std::call_once(terminateOnce, [] { previousTerminate = std::set_terminate(terminateWithMessage); });
  board::close();  // a previous init's store goes when its context does
  Context c;
  c.settings = o.settings ? *o.settings : Settings::fromEnvironment();
  configure(c.settings);
  const auto timeout = o.timeout.value_or(c.settings.timeout);
  c.launch = detect(o);
  const auto& l = c.launch;
  TESSERA_CHECK(l.worldSize > 0 && l.rank >= 0 && l.rank < l.worldSize,
                "tessera::init ({}): rank {} is not in [0, world size {})", l.launcher, l.rank, l.worldSize);
  log::setRank(l.rank);
  c.hostname = hostName();

  const std::string where = fmt::format("tessera::init ({} launch, rank {} of {}, {}): ", l.launcher, l.rank,
                                        l.worldSize, describeStore(l));
  StorePtr base = l.store;
  // Who runs the store, for the board's message when it is gone.
  std::string storeOwner = l.hostsStore ? fmt::format("rank {} (host {}, pid {})", l.rank, c.hostname, ::getpid())
                           : l.store    ? l.storeName
                                        : fmt::format("the server at {}:{}", l.storeHost, l.storePort);
  try {
    if (!base && l.hostsStore) {
      try {
        base = startStoreServer(l.storePort, timeout);
      } catch (const std::exception& e) {  // a port in use: whose (job.h)
        const auto holder = describePortHolder(l.storePort, e.what(), l.ownStore ? &l : nullptr);
        throw Error(holder.empty() ? e.what() : fmt::format("{}. {}", holder, e.what()));
      }
    } else if (!base) {
      base = connectStore(l.storeHost, l.storePort, timeout);
    }
    // Before any other key: whose store this is (job.h).
    if (l.ownStore && l.hostsStore) announceJob(*base, l);
    if (l.ownStore && !l.hostsStore) storeOwner = checkJob(*base, l, timeout);
  } catch (...) {
    rethrowWith(where);
  }
  // Fault injection for the tests (the store's host dying during start-up):
  // TESSERA_FAULT_INJECT=bootstrap-after-store:<rank>.
  injectFault(c.settings, "bootstrap-after-store", l.rank, "tessera::init");
  c.store = prefixStore(l.storePrefix, base);
  try {
    board::open(c.store, l.rank, l.worldSize, storeOwner, l.hostsStore);
  } catch (...) {
    rethrowWith(where);
  }

  int devices = cudaDeviceCount();
  Backend backend = chooseBackend(o, c.settings, devices);
  if (devices > 0 && backend == Backend::Nccl) {
    int dev = l.localRank % devices;
    cudaSelectDevice(dev);
    c.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(dev));
    c.deviceDescription = fmt::format("cuda:{} (PCI {})", dev, cudaPciBusId(dev));
  } else {
    c.deviceDescription = "cpu";
  }
  log::info("{} launch: rank {}/{} local rank {}/{} on host {}, device {}, backend {}", l.launcher, l.rank,
            l.worldSize, l.localRank, l.localWorldSize, c.hostname, c.deviceDescription, toString(backend));
  try {
    c.world = makeWorldCommunicator(backend, c.store, l.rank, l.worldSize, c.device, timeout);
  } catch (...) {
    rethrowWith(where);
  }
  return c;
}

}  // namespace tessera
