#pragma once
// tessera::init(): who am I, who are my peers, which device is mine, and the world
// communicator. Collective over all processes of the job.
//
// Detection order (the first that applies wins):
//   1. explicit InitOptions (rank and worldSize set), over InitOptions::store when given (e.g.
//      torch.distributed's default store, passed in by the Python module) or a TCPStore at
//      storeHost:storePort;
//   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; with
//      TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of the agent's store under
//      "/worker/attempt_{TORCHELASTIC_RESTART_COUNT}" (MASTER_PORT is never bound then).
//      RANK or WORLD_SIZE set with the others missing, or values that contradict each other
//      (RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE > WORLD_SIZE) are errors naming them;
//   3. PMIx (only when PMIX_NAMESPACE is set: srun --mpi=pmix, mpirun): rank 0 starts the
//      store (port TESSERA_STORE_PORT, else ephemeral) and publishes "<host>:<port>" (host:
//      TESSERA_STORE_HOST, else its host name) with PMIx_Put/Commit/Fence; peers PMIx_Get it
//      (when rank 0 cannot start the store, its error instead: every rank fails with it at once).
//      PMIx is finalized before detectPmix() returns;
//   4. SLURM's environment inside a job step (srun): SLURM_PROCID, SLURM_NTASKS,
//      SLURM_LOCALID, SLURM_NODEID + SLURM_STEP_TASKS_PER_NODE (local world); rank 0 runs the
//      store on the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (or
//      TESSERA_STORE_HOST); port: TESSERA_STORE_PORT, MASTER_PORT, or 29500 + SLURM_JOB_ID % 20000.
//      An sbatch script itself (SLURM_PROCID without SLURM_STEP_ID) is an error, not rank 0.
// A failure to reach or start the store, or to form the world communicator, is raised with
// "tessera::init (<launcher>, <store>)" in front: which launcher was detected and which store
// (server on a port, client of host:port, or the given store, and the prefix) was tried.
// Two jobs on one port (job.h): rank 0 that cannot bind the port says what holds it (another
// tessera job: its rank 0's host, pid, launcher, run id, world); a rank that reached another
// job's store fails at once naming both, before it writes a key there.
// Error board (comm/watchdog/board.h): init() opens it on the world store (claiming this rank:
// an error when another process holds it), so a failing rank's error and the ranks that died
// or stalled are named by every rank; programs call publishFatal() (below) in their last catch.
// Device: local rank modulo the visible CUDA devices (after CUDA_VISIBLE_DEVICES), or CPU.
// Settings: InitOptions::settings, else Settings::fromEnvironment() (the TESSERA_* variables,
// comm/settings.h), applied with configure() before anything else; Context::settings holds them.
// Backend: Settings::backend (TESSERA_BACKEND), else InitOptions::backend; default NCCL when
// built with it and a CUDA device is visible, else Gloo.
// Uncaught exceptions: the first init() installs a std::terminate handler that prints the
// exception's message ("tessera: fatal: ...") and exits 1 instead of aborting, so a library
// thread that dies of a lost connection ends the rank with a clear error (the previous handler
// still runs for std::terminate without an exception); the error goes to the board first.
// Signals: SIGPIPE is ignored when it has its default action, so a write to a dead peer's
// socket raises a clear error instead of killing the process.
#include <ATen/core/Tensor.h>

#include <exception>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/settings.h"
#include "comm/store.h"

namespace tessera {

struct InitOptions {
  // Explicit bootstrap: set rank and worldSize (and the store address).
  std::optional<int> rank, worldSize, localRank, localWorldSize;
  std::string storeHost = "127.0.0.1";
  std::optional<uint16_t> storePort;
  // Explicit bootstrap only: when false every rank is a client (someone else runs the server).
  bool rank0HostsStore = true;
  // Explicit bootstrap only: an existing store to use instead (its keys under storePrefix), and
  // how it is named in Context::launch and in messages.
  StorePtr store;
  std::string storePrefix = "tessera";
  std::string launcher = "explicit";
  std::string storeName;  // e.g. "torch.distributed's default store"
  std::optional<Backend> backend;
  // Per-op and store timeout; unset: the settings' (TESSERA_TIMEOUT_S, else 10 minutes).
  std::optional<std::chrono::milliseconds> timeout;
  // Unset: read from the environment.
  std::optional<Settings> settings;
};

// What the launcher told this process.
struct LaunchInfo {
  std::string launcher;  // "explicit" (or InitOptions::launcher) | "torchrun" | "pmix" | "slurm"
  int rank = 0, worldSize = 1, localRank = 0, localWorldSize = 1;
  std::string storeHost;
  uint16_t storePort = 0;
  bool hostsStore = false;    // this process runs the store server
  std::string storePrefix;    // namespace inside the store
  StorePtr store;             // set when the detector had to make the store itself (PMIx)
  std::string storeName;      // with `store`: how messages name it
  // Rank 0 of this job runs the store (not a launcher's agent, a test harness or a given store):
  // rank 0 announces the job there and the others check it (job.h).
  bool ownStore = false;
  // The launcher's id for this job, alike on its ranks: TORCHELASTIC_RUN_ID, the PMIx namespace,
  // SLURM's "job.step"; "" when the launcher gives none (explicit).
  std::string jobId;
};

// "server on port P", "client of H:P" or the given store's name, with the prefix.
std::string describeStore(const LaunchInfo& l);

struct Context {
  LaunchInfo launch;
  std::string hostname;
  StorePtr store;             // already prefixed for tessera's use
  at::Device device = at::Device(at::kCPU);
  std::string deviceDescription;  // "cpu" or "cuda:1 (PCI 0000:1b:00.0)"
  CommPtr world;
  Settings settings;              // as applied by init()
};

Context init(const InitOptions& opts = {});

// Local: what a program's last catch calls before it exits with an error (train_gpt's main does).
// Publishes `e` to the job's error board (comm/watchdog/board.h): the other ranks' failed
// collectives then name this rank, its host and `e` as the cause; a CommError is this rank's view
// of a failure elsewhere, never a cause. On the rank that runs the store, waits (at most 4 s)
// until the others have read it. Bounded; never throws; nothing before init().
void publishFatal(const std::exception& e);

// Detectors, each returns nullopt when its launcher is not present. Exposed for tests.
std::optional<LaunchInfo> detectTorchrun();
std::optional<LaunchInfo> detectPmix();
std::optional<LaunchInfo> detectSlurm();

// Makes the world communicator for `backend` over `store` (collective).
CommPtr makeWorldCommunicator(Backend backend, const StorePtr& store, int rank, int worldSize,
                              const at::Device& device, std::chrono::milliseconds timeout);

}  // namespace tessera
