#pragma once
// The job's error board: how the cause of a failure reaches every rank, in the job's store.
//
// A rank that dies of an error it can see (a bad checkpoint shard, a token outside the
// vocabulary, any exception that ends the program) publishes it before it exits; a rank whose
// collective then fails in transit (a closed connection, a timeout) reads the board and names
// the first cause — or, when nobody published one, the ranks that never reported: dead
// (killed) or stalled (stopped, hung), by rank, host and pid.
//
// Keys, under the world store's prefix ("<prefix>/board/"):
//   proc/<r>   "host pid" of rank r, claimed once by open() (compareSet)
//   cause      the first cause, written once (compareSet): "rank r (host h, pid p): message"
//   error/<r>  rank r's fatal error, or its report of a communication failure
//   count      how many ranks wrote error/<r>
//   done/<r>   rank r is finished with the board (the store's host waits for these)
// Nothing is read or written per step: only at open() and on failure.
//
// Bounds: a board call never hangs and never throws (open() excepted): its store calls run
// with a deadline (Options::storeDeadline); past it, or when the store is gone, the board says
// that the store (and who runs it) is unreachable and makes no further store call.
#include <chrono>
#include <exception>
#include <string>

#include "comm/store.h"

namespace tessera::board {

struct Options {
  // After a communication failure, how long a rank waits for a cause or every rank's report.
  std::chrono::milliseconds window = std::chrono::seconds(2);
  // The bound of one store call (or a few in a row) of the board.
  std::chrono::milliseconds storeDeadline = std::chrono::seconds(2);
  // The store's host, after its own fatal error: how long it keeps the store up for the others.
  std::chrono::milliseconds linger = std::chrono::seconds(4);
};

// Local (tessera::init calls it before making the world communicator): this process is `rank`
// of `world` over `store` (tessera's prefixed store; the board keeps a reference to it until
// close() or the next open()). `storeOwner` names who runs the store for the message when it is
// gone ("rank 0 (host h, pid p)", "the store at h:p"); `hostsStore`: this process runs it.
// Claims proc/<rank>: throws tessera::Error when another process already holds rank `rank` of
// this store (another job on the same port, or two processes given the same rank).
void open(const StorePtr& store, int rank, int world, const std::string& storeOwner, bool hostsStore,
          const Options& o = {});
// Local: forgets the store (init() calls it first, so a new server on the same port is new).
void close();
// Local; once per process, no-op before open(). This process dies of `message`: published as
// its error and, unless it is a communication failure (`commFailure`, or the process already
// saw one, whose consequences are not causes), as the job's first cause if none is yet.
void publishError(const std::string& message, bool commFailure);
// Local: a collective of this rank failed in transit with `failure`. Reports it, waits up to
// Options::window for a published cause or every rank's report, and returns what to add to
// the error: "rank 1 (host h, pid p) failed first: ...", or the ranks that never reported and
// what this host can tell of them (gone, stopped), or that the store is unreachable. The first
// call of a process does this; later calls return the same text at once. "" before open().
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
