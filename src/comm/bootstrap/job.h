#pragma once
// Whose store is this? Two jobs on one port must not meet in one store.
//
// Where rank 0 of a job runs the store (LaunchInfo::ownStore: torchrun without an agent
// store, PMIx, SLURM's environment, explicit), it writes the job's identity at the key
// "tessera-job" of the store's root before anything else; every other rank reads it before it
// writes any key of its own and compares: a rank that reached another job's store fails at
// once naming both jobs and the port, and that job is left alone. The identity is what a job's
// ranks know alike without talking: the launcher, the launcher's id for the job
// (TORCHELASTIC_RUN_ID, the PMIx namespace, SLURM's job.step; none for explicit launches), the
// world size and the key prefix. Jobs alike in all of these are told apart by the rank claim of
// the error board (board::open: a rank held by another process).
#include <chrono>
#include <cstdint>
#include <string>

#include "tessera/comm/bootstrap/init.h"

namespace tessera {

// Local, rank 0 of a job that runs its own store, right after starting it.
void announceJob(c10d::Store& root, const LaunchInfo& l);
// Local, every other rank of such a job, before it writes a key: waits for rank 0's identity
// (up to `timeout`: rank 0 may start later) and returns "rank 0 (host h, pid p)". Throws
// tessera::Error naming both jobs and the port when the store is another job's, and at once
// when this job's rank 0 left word there that it could not host the store (describePortHolder).
std::string checkJob(c10d::Store& root, const LaunchInfo& l, std::chrono::milliseconds timeout);
// Rank 0 could not start the store on `port` of this host, failing with `error`: when the port is
// in use, what holds it ("another tessera job holds port P: its rank 0 (host h, pid p) ..." or
// "another process holds port P ..."), read from the store found there, and what to do; else "".
// Given its job `l` and a holder that answers as a store but is no tessera job's (a launcher's
// agent), it also leaves that text there, at a key of this job's identity, for checkJob() of the
// other ranks, which reached the same store. At most about 3 s; never throws.
std::string describePortHolder(uint16_t port, const std::string& error, const LaunchInfo* l = nullptr);

}  // namespace tessera
