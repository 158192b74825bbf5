#pragma once
// tessera::init(): who am I, who are my peers, which device is mine, and the world communicator.
// Collective over every process of the job. Launchers, the first that applies: explicit
// InitOptions (rank and worldSize), torchrun, PMIx (PMIX_NAMESPACE set), SLURM's environment (srun);
// the detectors below say what each reads. Settings: InitOptions::settings, else the TESSERA_*
// variables, applied with configure() first. Backend: Settings::backend, else InitOptions::backend,
// else NCCL when built with it and a CUDA device is visible, else Gloo. Device: with NCCL, the local
// rank modulo the visible CUDA devices (after CUDA_VISIBLE_DEVICES); else the CPU.
// Process-wide effects: the job's error board is opened on the world store, claiming this rank
// (comm/watchdog/board.h); the first init() makes std::terminate with an exception print it
// ("tessera: fatal: ..."), publish it to the board and exit 1; SIGPIPE at its default is ignored.
// Errors (tessera::Error): launcher variables missing or contradicting each other, named; a store
// of another job on the port, or this rank held by another process; a failure to reach or start
// the store or to form the world communicator, prefixed "tessera::init (<launcher> launch, rank r
// of n, <store>): " (CommError stays CommError). Design: docs/design/communication.md.
#include <ATen/core/Tensor.h>

#include <exception>
#include <optional>
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/comm/settings.h"
#include "tessera/comm/store.h"

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
  StorePtr store;             // the store made by the detector (PMIx) or given (explicit)
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

// Collective over every process of the job: see the top of this header.
Context init(const InitOptions& opts = {});

// Example:
//   tessera::Context job = tessera::init();  // under torchrun, mpirun, srun, or InitOptions
//   try {
//     job.world->barrier()->wait();
//   } catch (const std::exception& e) {
//     tessera::publishFatal(e);  // the other ranks' errors name this one as the cause
//     throw;
//   }

// Local, bounded, never throws; nothing before init(). What a program's last catch calls: publishes
// `e` on the job's error board, so the other ranks' failed collectives name this rank as the cause
// (a CommError never is one); the store's host then waits up to 4 s for the others to read it.
void publishFatal(const std::exception& e);

// Detectors, each returns nullopt when its launcher is not present. Exposed for tests.
// torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK, LOCAL_WORLD_SIZE); with
// TORCHELASTIC_USE_AGENT_STORE=True, a client of the agent's store. RANK or WORLD_SIZE set without
// the others, or values that contradict each other, are errors naming them.
std::optional<LaunchInfo> detectTorchrun();
// PMIx, only when PMIX_NAMESPACE is set: rank 0 starts the store (TESSERA_STORE_PORT, else
// ephemeral) and publishes its address (or its error, failing every rank) through PMIx; PMIx is
// finalized before this returns.
std::optional<LaunchInfo> detectPmix();
// SLURM's environment in a job step (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; rank 0 runs
// the store on the step's first host (or TESSERA_STORE_HOST), port TESSERA_STORE_PORT, MASTER_PORT
// or 29500 + SLURM_JOB_ID % 20000. An sbatch script itself (no SLURM_STEP_ID) is an error.
std::optional<LaunchInfo> detectSlurm();

// Makes the world communicator for `backend` over `store` (collective).
CommPtr makeWorldCommunicator(Backend backend, const StorePtr& store, int rank, int worldSize,
                              const at::Device& device, std::chrono::milliseconds timeout);

}  // namespace tessera
