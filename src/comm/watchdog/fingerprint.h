#pragma once
// Debug mode (setEnabled(true); Settings::debugDetail, TESSERA_DEBUG=detail): before each
// collective, the ranks of the group compare a fingerprint of the call — op, dtype, sizes,
// reduction/root, group and sequence number — through the rendezvous store, and fail with a
// message naming the ranks that disagree and what each called, instead of hanging in (or
// silently corrupting) the collective.
//
// Protocol, per communicator namespace `ns` (unique per group, equal on its ranks) and op
// sequence number s: every rank sets  tessera-debug/<ns>/op/<s>/<rank> = fingerprint,  then
// waits (up to the op's timeout) for every rank's key and compares. A rank that never posts
// (it called a collective on another group, or nothing) is named together with the last
// collective it did post anywhere (tessera-debug/proc/<host:pid>; membership is posted by join() when the
// communicator is made), so a group or order
// mismatch is reported as such. A rank deletes its key of s - 2 when posting s: every rank has
// read it by then (it posted s - 1 only after reading all of s - 2). Point-to-point ops are not
// checked (they are not collective). Costs a few store round trips per collective: a debugging
// aid, not for production runs.
#include <chrono>
#include <string>

#include "comm/store.h"
#include "comm/types.h"

namespace tessera::fingerprint {

// Whether debug mode is on (default off). Set it before making communicators: they join their
// group's namespace when made.
bool enabled();
void setEnabled(bool on);
// Records that this process is `rank` of the group `ns` (so others can say what it did).
void join(const StorePtr& store, const std::string& ns, int rank);
// Runs the check for the op `i` (rank i.rank of i.groupSize). Throws tessera::Error on a
// mismatch or when some rank does not arrive within `timeout`.
void check(const StorePtr& store, const std::string& ns, const OpInfo& i, std::chrono::milliseconds timeout);

}  // namespace tessera::fingerprint
