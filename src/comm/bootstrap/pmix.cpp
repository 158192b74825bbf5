// Bootstrap through PMIx (srun --mpi=pmix, OpenMPI's mpirun).
//
// Only when PMIX_NAMESPACE is set (without a server PMIx_Init quietly makes a singleton).
// rank = our proc's rank; world = PMIX_JOB_SIZE and local world = PMIX_LOCAL_SIZE (both on the
// wildcard rank); local rank = PMIX_LOCAL_RANK. Rank 0 starts the TCPStore server (port
// TESSERA_STORE_PORT, else an ephemeral one) and publishes "tessera.store" = "<host>:<port>"
// (host: TESSERA_STORE_HOST, else this host's name) with PMIx_Put + PMIx_Commit; everyone
// fences with PMIX_COLLECT_DATA, then peers PMIx_Get rank 0's key. When rank 0 cannot start
// the store (a fixed port another job holds) it publishes its error instead, and every rank
// fails with it at once.
//
// Finalize: tessera needs PMIx only for this exchange, so detectPmix() ends with a data-less
// fence (nobody disconnects while a peer may still be reading rank 0's key) and PMIx_Finalize.
// A launcher then sees a process that finalized and later exits with its own status: mpirun
// (ORTE) and srun report a normal exit as normal and a non-zero one as a failure. A process
// that called PMIx_Init and exits without PMIx_Finalize is what mpirun reports as "exited
// improperly", so every path out of detectPmix(), errors included, finalizes first.
#include "tessera/comm/bootstrap/init.h"

#ifdef TESSERA_HAVE_PMIX

#include <pmix.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "comm/bootstrap/job.h"
#include "common/env.h"
#include "common/host.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

// Throws tessera::Error naming the PMIx call, the file:line, the rank and PMIx's error text.
#define PMIX_CHECK(rank, call)                                                                                    \
  do {                                                                                                            \
    pmix_status_t pmix_check_status_ = (call);                                                                    \
    if (pmix_check_status_ != PMIX_SUCCESS)                                                                       \
      throw ::tessera::Error(fmt::format("tessera PMIx bootstrap: {} failed at {}:{} on rank {}: {} ({})", #call, \
                                         __FILE__, __LINE__, (rank), PMIx_Error_string(pmix_check_status_),     \
                                         static_cast<int>(pmix_check_status_)));                                 \
  } while (0)

namespace tessera {
namespace {

constexpr const char* kStoreKey = "tessera.store";

long long valueAsInt(const pmix_value_t* v, const char* key, int rank) {
  switch (v->type) {
    case PMIX_UINT8: return v->data.uint8;
    case PMIX_UINT16: return v->data.uint16;
    case PMIX_UINT32: return v->data.uint32;
    case PMIX_UINT64: return static_cast<long long>(v->data.uint64);
    case PMIX_INT: return v->data.integer;
    case PMIX_INT16: return v->data.int16;
    case PMIX_INT32: return v->data.int32;
    case PMIX_INT64: return v->data.int64;
    case PMIX_UINT: return v->data.uint;
    case PMIX_SIZE: return static_cast<long long>(v->data.size);
    case PMIX_PROC_RANK: return v->data.rank;
    default:
      throw Error(fmt::format("tessera PMIx bootstrap: rank {}: key {} has type {}, not an integer", rank, key,
                              PMIx_Data_type_string(v->type)));
  }
}

// Releases PMIx values on scope exit.
struct ValueGuard {
  pmix_value_t* v = nullptr;
  ~ValueGuard() {
    if (v) PMIX_VALUE_RELEASE(v);
  }
};

// PMIx info array {PMIX_TIMEOUT: seconds} (+ PMIX_COLLECT_DATA when asked).
struct FenceInfo {
  pmix_info_t info[2];
  size_t n = 0;
  FenceInfo(int timeoutS, bool collect) {
    PMIx_Info_load(&info[n++], PMIX_TIMEOUT, &timeoutS, PMIX_INT);
    if (collect) {
      bool yes = true;
      PMIx_Info_load(&info[n++], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    }
  }
  ~FenceInfo() {
    for (size_t i = 0; i < n; ++i) PMIX_INFO_DESTRUCT(&info[i]);
  }
};

long long getInt(const pmix_proc_t& who, const char* key, int rank, int timeoutS) {
  FenceInfo info(timeoutS, false);
  ValueGuard val;
  PMIX_CHECK(rank, PMIx_Get(&who, key, info.info, info.n, &val.v));
  TESSERA_CHECK(val.v, "tessera PMIx bootstrap: rank {}: PMIx_Get({}) returned no value", rank, key);
  return valueAsInt(val.v, key, rank);
}

// "host:port" → (host, port); throws naming the text.
std::pair<std::string, uint16_t> splitAddress(const std::string& a, int rank) {
  auto colon = a.rfind(':');
  TESSERA_CHECK(colon != std::string::npos && colon > 0,
                "tessera PMIx bootstrap: rank {}: rank 0 published store address '{}', not host:port", rank, a);
  char* end = nullptr;
  long port = std::strtol(a.c_str() + colon + 1, &end, 10);
  TESSERA_CHECK(end && *end == '\0' && port > 0 && port < 65536,
                "tessera PMIx bootstrap: rank {}: store address '{}' has no valid port", rank, a);
  return {a.substr(0, colon), static_cast<uint16_t>(port)};
}

LaunchInfo exchange(const pmix_proc_t& me, int timeoutS) {
  LaunchInfo l;
  l.launcher = "pmix";
  l.rank = static_cast<int>(me.rank);
  pmix_proc_t job;
  PMIX_PROC_CONSTRUCT(&job);
  PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
  l.worldSize = static_cast<int>(getInt(job, PMIX_JOB_SIZE, l.rank, timeoutS));
  l.localWorldSize = static_cast<int>(getInt(job, PMIX_LOCAL_SIZE, l.rank, timeoutS));
  l.localRank = static_cast<int>(getInt(me, PMIX_LOCAL_RANK, l.rank, timeoutS));
  l.storePrefix = fmt::format("tessera/{}", me.nspace);
  l.jobId = me.nspace;
  l.ownStore = true;

  // Rank 0 publishes the store's address, or why it has none ("!" + its error, e.g. a fixed
  // port another job holds): then every rank fails at once with rank 0's error instead of
  // waiting in the fence for a rank that left.
  std::string failed;
  if (l.rank == 0) {
    auto port = env::getInt("TESSERA_STORE_PORT").value_or(0);
    std::string addr;
    try {
      TESSERA_CHECK(port >= 0 && port < 65536, "tessera PMIx bootstrap: TESSERA_STORE_PORT={} is not a TCP port",
                    port);
      try {
        l.store = startStoreServer(static_cast<uint16_t>(port), settings().timeout);
      } catch (const Error& e) {  // a fixed port in use: whose (job.h)
        const auto holder = describePortHolder(static_cast<uint16_t>(port), e.what());
        throw Error(holder.empty() ? e.what() : fmt::format("{}. {}", holder, e.what()));
      }
      l.hostsStore = true;
      l.storeHost = env::get("TESSERA_STORE_HOST").value_or(hostName());
      l.storePort = storePort(l.store);
      addr = fmt::format("{}:{}", l.storeHost, l.storePort);
    } catch (const std::exception& e) {
      failed = e.what();
      addr = "!" + failed;
    }
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(addr.c_str());  // PMIx_Put copies the value
    PMIX_CHECK(l.rank, PMIx_Put(PMIX_GLOBAL, kStoreKey, &v));
    PMIX_CHECK(l.rank, PMIx_Commit());
  }
  {
    FenceInfo info(timeoutS, true);
    PMIX_CHECK(l.rank, PMIx_Fence(&job, 1, info.info, info.n));
  }
  if (l.rank != 0) {
    pmix_proc_t root;
    PMIX_PROC_CONSTRUCT(&root);
    PMIX_LOAD_PROCID(&root, me.nspace, 0);
    FenceInfo info(timeoutS, false);
    ValueGuard val;
    PMIX_CHECK(l.rank, PMIx_Get(&root, kStoreKey, info.info, info.n, &val.v));
    TESSERA_CHECK(val.v && val.v->type == PMIX_STRING && val.v->data.string,
                  "tessera PMIx bootstrap: rank {}: rank 0's key {} is not a string", l.rank, kStoreKey);
    const std::string addr = val.v->data.string;
    if (addr.rfind('!', 0) == 0) {
      failed = fmt::format("rank 0 could not start the store: {}", addr.substr(1));
    } else {
      std::tie(l.storeHost, l.storePort) = splitAddress(addr, l.rank);
    }
  }
  {  // Nobody finalizes while a peer may still be reading rank 0's key.
    FenceInfo info(timeoutS, false);
    PMIX_CHECK(l.rank, PMIx_Fence(&job, 1, info.info, info.n));
  }
  if (!failed.empty()) throw Error(fmt::format("tessera PMIx bootstrap: rank {} of {}: {}", l.rank, l.worldSize, failed));
  return l;
}

}  // namespace

std::optional<LaunchInfo> detectPmix() {
  if (!env::get("PMIX_NAMESPACE")) return std::nullopt;
  int timeoutS = static_cast<int>(std::max<long long>(1, settings().timeout.count() / 1000));
  pmix_proc_t me;
  PMIX_PROC_CONSTRUCT(&me);
  long long envRank = env::getInt("PMIX_RANK").value_or(-1);
  PMIX_CHECK(envRank, PMIx_Init(&me, nullptr, 0));
  std::optional<LaunchInfo> result;
  try {
    result = exchange(me, timeoutS);
  } catch (...) {
    pmix_status_t st = PMIx_Finalize(nullptr, 0);
    if (st != PMIX_SUCCESS) log::warn("PMIx_Finalize after a failed bootstrap: {}", PMIx_Error_string(st));
    throw;
  }
  PMIX_CHECK(result->rank, PMIx_Finalize(nullptr, 0));
  log::debug("PMIx bootstrap: namespace {} rank {}/{} local {}/{} store {}:{}", me.nspace, result->rank,
             result->worldSize, result->localRank, result->localWorldSize, result->storeHost, result->storePort);
  return result;
}

}  // namespace tessera

#else  // !TESSERA_HAVE_PMIX

#include "common/env.h"
#include "tessera/common/log.h"

namespace tessera {
std::optional<LaunchInfo> detectPmix() {
  if (env::get("PMIX_NAMESPACE"))
    log::warn("PMIX_NAMESPACE is set but tessera was built without PMIx; trying the SLURM environment next");
  return std::nullopt;
}
}  // namespace tessera

#endif
