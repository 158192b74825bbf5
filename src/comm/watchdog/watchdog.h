#pragma once
// Process-wide failure handling for communication (the per-communicator watchdogs of the
// backends detect; this decides what the process does).
//
// When a backend finds that an op failed in transit — a timeout, a lost peer, an NCCL
// asynchronous error (never for bad input, which throws at the call) — it adds the cause with
// withCause(), fails the op with that text and calls onCommFailure(). The first such call in a
// process:
//   1. logs the failure and the flight record (flight_recorder.h) of every group;
//   2. aborts every other live communicator of the process, so no rank blocks on a group
//      whose peer is gone (their pending and later ops fail with a message naming the cause);
//   3. unless setExitPolicy(false, ...) (TESSERA_EXIT_ON_ERROR=0), ends the process with exit
//      code 3 after a grace period (default 5 s; TESSERA_EXIT_GRACE_S) — enough for the error
//      to reach the caller (wait() throws) and be reported by the program itself, and a
//      bound on the case where the main thread is stuck (a hung kernel, a blocked store
//      call), so the launcher (torchrun, srun, mpirun) always sees a failed rank and ends
//      the job.
// Later calls only log their reason.
#include <chrono>
#include <memory>
#include <string>

namespace tessera {

class Communicator;

namespace watchdog {

// `reason` (the op, group, rank and what failed) followed by "\n  cause: " and what the job's
// error board (board.h) says: the first error another rank published, else the ranks that
// never reported (dead or stalled) by rank, host and pid, or that the store is unreachable;
// `reason` alone before tessera::init opened the board. The first call of a process asks the
// board (at most board::explainBound()); later calls reuse its answer.
std::string withCause(const std::string& reason);
// Registers a communicator so a failure elsewhere in the process can abort it. Idempotent;
// held weakly (the registry never keeps a communicator alive).
void track(const std::shared_ptr<Communicator>& comm);
// See above. `reason` names the op, group, rank and cause. `from` is the failing
// communicator's address (it is not aborted again; null when unknown: aborting a broken
// communicator again is harmless).
void onCommFailure(const std::string& reason, const void* from);
// Whether a failure ends the process, and after how long (Settings::exitOnError, exitGrace).
void setExitPolicy(bool exitOnError, std::chrono::milliseconds grace);
// Exit code used when the grace period ends.
constexpr int kExitCode = 3;

}  // namespace watchdog
}  // namespace tessera
