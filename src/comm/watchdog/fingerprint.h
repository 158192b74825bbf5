#pragma once
// Collective checks: before a collective runs, the ranks of its group compare what each called and a
// mismatch fails on every rank naming every rank's call, instead of a hang, a crash in a backend's
// thread or silently corrupted data. Modes (setMode; Settings, TESSERA_DEBUG=off|fingerprint|detail):
// - Fingerprint (default): each collective's OpInfo::fingerprint (make()) is all-gathered by the
//   backend over the op's own connections just before the op (a few bytes, no store, no host
//   synchronisation on CUDA) and compared (compare()). Catches size, dtype, op, reduction and root
//   mismatches; a rank that never calls is a timeout, as without the check.
// - Detail (debug mode; enabled()): check() compares through the rendezvous store and also names a
//   rank that never arrives with the last collective it posted. A few store round trips per op.
// Point-to-point ops are never checked. The mode must be equal on every rank; communicators take it
// when made. Keys of detail mode: tessera-debug/<ns>/op/<seq>/<rank>, tessera-debug/<ns>/who/<rank>
// (join()), tessera-debug/proc/<host:pid> (the last call). docs/design/failures.md: the protocols.
#include <array>
#include <chrono>
#include <string>

#include "tessera/comm/store.h"
#include "tessera/comm/types.h"

namespace tessera::fingerprint {

enum class Mode { Off, Fingerprint, Detail };
Mode mode();  // Fingerprint until setMode()
void setMode(Mode m);
// Whether detail mode is on.
bool enabled();

// --- Fingerprint mode (local functions; the backend does the exchange) ---
enum Op : int64_t { kAllReduce = 1, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll, kBarrier };
constexpr int kWords = 4;
// OpInfo::fingerprint of call `seq`: `t` its input (undefined for a barrier), `reduce` its ReduceOp
// or -1, `root` or -1.
std::array<int64_t, kWords> make(Op op, uint64_t seq, const at::Tensor& t, int reduce, int root);
// "all_reduce of 4 x float32 (sum)", from one rank's words.
std::string describeCall(const int64_t* words);
// `all`: i.groupSize fingerprints (kWords each, in rank order) as gathered for op `i`. "" when all
// equal i.fingerprint; else "the ranks called different collectives: rank 0 called ...; rank 1
// (this rank) called ...", ranks with the same call grouped.
std::string compare(const OpInfo& i, const int64_t* all);

// --- Detail mode ---
// Local: records that this process is `rank` of the group `ns` (so others can say what it did).
// `ns` is unique per group and equal on its ranks.
void join(const StorePtr& store, const std::string& ns, int rank);
// Runs the check for the op `i` (rank i.rank of i.groupSize). Throws tessera::Error on a
// mismatch or when some rank does not arrive within `timeout`.
void check(const StorePtr& store, const std::string& ns, const OpInfo& i, std::chrono::milliseconds timeout);

}  // namespace tessera::fingerprint
