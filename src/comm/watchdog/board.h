#pragma once
// The job's error board: how the cause of a failure reaches every rank, through the job's store
// ("<prefix>/board/"). A rank that dies of an error it can see publishes it before it exits; a rank
// whose collective then fails in transit reads the board and names the first cause or, when nobody
// published one, the ranks that never reported (dead or stalled), by rank, host and pid.
// Keys: proc/<r> ("host pid", claimed by open()), cause (the first cause, written once), error/<r>
// (rank r's error or report), count (ranks that wrote error/<r>), done/<r> (rank r is finished with
// the board). Nothing is read or written per step: only at open() and on failure.
// Local; one board per process, thread-safe. Bounded: no call hangs, none throws but open(); store
// calls run with a deadline (Options::storeDeadline), past which the board says that the store
// (and who runs it) is unreachable and makes no further store call.
// The protocol and its reasons: docs/design/failures.md.
#include <chrono>
#include <exception>
#include <string>

#include "tessera/comm/store.h"

namespace tessera::board {

struct Options {
  // After a communication failure, how long a rank waits for a cause or every rank's report.
  std::chrono::milliseconds window = std::chrono::seconds(2);
  // The bound of one store call (or a few in a row) of the board.
  std::chrono::milliseconds storeDeadline = std::chrono::seconds(2);
  // The store's host, after its own fatal error: how long it keeps the store up for the others.
  std::chrono::milliseconds linger = std::chrono::seconds(4);
};

// Local (init() calls it before the world communicator): this process is `rank` of `world` over
// `store` (kept until close() or the next open()); `storeOwner` names who runs it for messages,
// `hostsStore` says this process does. Throws tessera::Error when another process holds proc/<rank>.
void open(const StorePtr& store, int rank, int world, const std::string& storeOwner, bool hostsStore,
          const Options& o = {});
// Local: forgets the store (init() calls it first, so a new server on the same port is new).
void close();
// Local; once per process, no-op before open(). This process dies of `message`: published as
// its error and, unless it is a communication failure (`commFailure`, or the process already
// saw one, whose consequences are not causes), as the job's first cause if none is yet.
void publishError(const std::string& message, bool commFailure);
// Local: a collective failed in transit with `failure`. The first call reports it, waits up to
// Options::window for a cause or every rank's report, and returns what to add to the error (the
// cause, the silent ranks, or an unreachable store); later calls return it at once; "" before open().
std::string explainCommFailure(const std::string& failure);
// Local, after publishError(): on the store's host, waits (up to Options::linger) until every
// other rank is finished with the board or known silent, so their reads find the store; elsewhere
// returns at once.
void lingerForPeers();

// Local: publishError(e.what(), whether `e` is a CommError), then lingerForPeers(): what the last
// catch of a program (train_gpt's main, the terminate handler, Python's excepthook) calls.
void publishFatal(const std::exception& e);
// The longest explainCommFailure() takes (a waiter's margin beyond an op's own timeout).
std::chrono::milliseconds explainBound();

}  // namespace tessera::board
