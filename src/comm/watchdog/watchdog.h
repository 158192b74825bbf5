#pragma once
// Process-wide failure handling for communication: the backends' per-communicator watchdogs detect
// that an op failed in transit (a timeout, a lost peer, an NCCL asynchronous error; never bad input,
// which throws at the call); this decides what the process does. Local, thread-safe.
// A backend adds the cause (withCause()), fails the op with that text and calls onCommFailure().
// The first such call in a process logs the failure and every group's flight record
// (flight_recorder.h), aborts every other live communicator (their pending and later ops fail
// naming the cause) and, unless setExitPolicy(false, ...) (TESSERA_EXIT_ON_ERROR=0), ends the
// process with kExitCode after a grace period (default 5 s; TESSERA_EXIT_GRACE_S). Later calls
// only log their reason. Why an exit, and why a grace period: docs/design/failures.md.
#include <chrono>
#include <memory>
#include <string>

namespace tessera {

class Communicator;

namespace watchdog {

// `reason` (the op, group, rank and what failed) followed by "\n  cause: " and what the error board
// says (board.h: board::explainCommFailure); `reason` alone before tessera::init opened the board.
// The first call of a process asks the board (at most board::explainBound()); later ones reuse it.
std::string withCause(const std::string& reason);
// Registers a communicator so a failure elsewhere in the process can abort it. Idempotent;
// held weakly (the registry never keeps a communicator alive).
void track(const std::shared_ptr<Communicator>& comm);
// See the top of this header. `reason` names the op, group, rank and cause; `from` is the failing
// communicator's address, not aborted again (null when unknown: aborting it again is harmless).
void onCommFailure(const std::string& reason, const void* from);
// Whether a failure ends the process, and after how long (Settings::exitOnError, exitGrace).
void setExitPolicy(bool exitOnError, std::chrono::milliseconds grace);
// Exit code used when the grace period ends.
constexpr int kExitCode = 3;

}  // namespace watchdog
}  // namespace tessera
