#pragma once
// Debug mode (setEnabled(true); Settings::debugDetail, TESSERA_DEBUG=detail): before each
// collective the ranks of its group compare a fingerprint of the call (op, sequence number and
// detail: sizes, dtype, reduction or root) through the rendezvous store, and fail naming the ranks
// that disagree and what each called, instead of hanging in (or silently corrupting) the collective.
// A rank that never arrives is named with the last collective it posted on any group. Point-to-point
// ops are not checked. Collective over the op's group; costs a few store round trips per
// collective: a debugging aid, not for production runs.
// Keys: tessera-debug/<ns>/op/<seq>/<rank>, tessera-debug/<ns>/who/<rank> (join()) and
// tessera-debug/proc/<host:pid> (the last call). The protocol: docs/design/failures.md.
#include <chrono>
#include <string>

#include "tessera/comm/store.h"
#include "tessera/comm/types.h"

namespace tessera::fingerprint {

// Whether debug mode is on (default off). Set it before making communicators: they join their
// group's namespace when made.
bool enabled();
void setEnabled(bool on);
// Local: records that this process is `rank` of the group `ns` (so others can say what it did).
// `ns` is unique per group and equal on its ranks.
void join(const StorePtr& store, const std::string& ns, int rank);
// Runs the check for the op `i` (rank i.rank of i.groupSize). Throws tessera::Error on a
// mismatch or when some rank does not arrive within `timeout`.
void check(const StorePtr& store, const std::string& ns, const OpInfo& i, std::chrono::milliseconds timeout);

}  // namespace tessera::fingerprint
