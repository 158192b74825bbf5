// Bootstrap from SLURM's environment (srun without PMIx, e.g. srun --mpi=none).
//
// rank = SLURM_PROCID, world = SLURM_NTASKS, local rank = SLURM_LOCALID, local world = entry
// SLURM_NODEID of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE). Rank 0 runs the
// store on the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), or on
// TESSERA_STORE_HOST when set; port TESSERA_STORE_PORT, else MASTER_PORT, else
// 29500 + SLURM_JOB_ID % 20000.
#include <unistd.h>

#include "comm/bootstrap/hostlist.h"
#include "tessera/comm/bootstrap/init.h"
#include "common/env.h"
#include "common/host.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera {
namespace {

// "vm.cluster.local" → "vm": Slurm node names are usually short host names.
std::string shortName(const std::string& h) { return h.substr(0, h.find('.')); }

int requireInt(const char* name, long long lo, long long hi) {
  auto v = env::getInt(name);
  TESSERA_CHECK(v, "tessera SLURM bootstrap: {} is not set", name);
  TESSERA_CHECK(*v >= lo && *v <= hi, "tessera SLURM bootstrap: {}={} is out of range [{}, {}]", name, *v, lo, hi);
  return static_cast<int>(*v);
}

uint16_t storePortFromEnv() {
  for (const char* name : {"TESSERA_STORE_PORT", "MASTER_PORT"}) {
    if (auto p = env::getInt(name)) {
      TESSERA_CHECK(*p > 0 && *p < 65536, "tessera SLURM bootstrap: {}={} is not a TCP port", name, *p);
      return static_cast<uint16_t>(*p);
    }
  }
  auto job = env::getInt("SLURM_JOB_ID");
  TESSERA_CHECK(job && *job >= 0,
                "tessera SLURM bootstrap: no store port: set TESSERA_STORE_PORT or MASTER_PORT (SLURM_JOB_ID is {})",
                job ? std::to_string(*job) : std::string("not set"));
  return static_cast<uint16_t>(29500 + *job % 20000);
}

}  // namespace

std::optional<LaunchInfo> detectSlurm() {
  if (!env::get("SLURM_PROCID") || !env::get("SLURM_NTASKS")) return std::nullopt;
  // The batch script of sbatch carries SLURM_PROCID=0 and the job's SLURM_NTASKS too, but it is
  // one process: waiting there for the other "ranks" would hang until the timeout.
  TESSERA_CHECK(env::get("SLURM_STEP_ID") || env::get("SLURM_STEPID"),
                "tessera SLURM bootstrap: SLURM_PROCID is set but SLURM_STEP_ID is not: this process is the batch "
                "script, not a task of a job step; start the ranks with srun");
  LaunchInfo l;
  l.launcher = "slurm";
  l.worldSize = requireInt("SLURM_NTASKS", 1, 1 << 24);
  l.rank = requireInt("SLURM_PROCID", 0, l.worldSize - 1);
  l.localRank = requireInt("SLURM_LOCALID", 0, l.worldSize - 1);

  const char* tpnVar = env::get("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  auto tpnText = env::get(tpnVar);
  TESSERA_CHECK(tpnText, "tessera SLURM bootstrap: neither SLURM_STEP_TASKS_PER_NODE nor SLURM_TASKS_PER_NODE is set");
  auto perNode = slurm::expandTasksPerNode(*tpnText, tpnVar);
  int node = requireInt("SLURM_NODEID", 0, 1 << 24);
  TESSERA_CHECK(node < static_cast<int>(perNode.size()),
                "tessera SLURM bootstrap: SLURM_NODEID={} but {}='{}' lists {} node(s)", node, tpnVar, *tpnText,
                perNode.size());
  l.localWorldSize = perNode[node];
  TESSERA_CHECK(l.localRank < l.localWorldSize,
                "tessera SLURM bootstrap: rank {}: SLURM_LOCALID={} but {}='{}' gives node {} only {} task(s)", l.rank,
                l.localRank, tpnVar, *tpnText, node, l.localWorldSize);

  const char* nlVar = env::get("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  auto nodelist = env::get(nlVar);
  TESSERA_CHECK(nodelist, "tessera SLURM bootstrap: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set");
  auto hosts = slurm::expandHostlist(*nodelist, nlVar);
  if (auto h = env::get("TESSERA_STORE_HOST")) {
    l.storeHost = *h;
  } else {
    l.storeHost = hosts.front();
    // Rank 0 serves the store; with an unusual task distribution it may not sit on the first
    // host, and every other rank would then wait for a store that never comes.
    if (l.rank == 0) {
      auto me = env::get("SLURMD_NODENAME");
      if (!me) me = hostName();
      TESSERA_CHECK(shortName(*me) == shortName(l.storeHost),
                    "tessera SLURM bootstrap: rank 0 runs on '{}' but the store address is the first host '{}' of "
                    "{}='{}'; use a block distribution or set TESSERA_STORE_HOST",
                    *me, l.storeHost, nlVar, *nodelist);
    }
  }
  l.storePort = storePortFromEnv();
  l.hostsStore = l.rank == 0;
  l.ownStore = true;
  l.jobId = fmt::format("{}.{}", env::get("SLURM_JOB_ID").value_or("0"),
                        env::get("SLURM_STEP_ID").value_or(env::get("SLURM_STEPID").value_or("0")));
  l.storePrefix = "tessera/slurm/" + l.jobId;
  log::debug("SLURM bootstrap: rank {}/{} local {}/{} store {}:{} ({} nodes in {})", l.rank, l.worldSize, l.localRank,
             l.localWorldSize, l.storeHost, l.storePort, hosts.size(), nlVar);
  return l;
}

}  // namespace tessera
