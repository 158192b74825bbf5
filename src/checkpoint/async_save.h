#pragma once
// Checkpoints saved while training goes on (as torchtitan's async_with_pinned_mem): the same
// files, atomic renames and <dir>.old fallback as checkpoint::save (checkpoint.h), but the
// caller waits only for the pieces to be staged in host memory; pickling, writing and
// publishing run on a writer thread.
//
//   AsyncSaver saver(world, ctx.store, timeout);
//   for (step ...) {
//     forward/backward ...
//     saver.beforeUpdate();            // before anything overwrites the saved tensors
//     optimizer step ...
//     if (save now) saver.save(dir, pieces, step, extra);
//     saver.poll();                    // a failed save ends the run at the next step
//   }
//   saver.wait();                      // the last save is published (rank 0) before the end
//
// Contract:
// - save() is collective over `comm` (like checkpoint::save: the ranks agree which of them
//   writes each replicated box, and rank 0 empties <dir>.tmp). It first waits for this rank's
//   previous save (one save in flight; its error is thrown here). It copies this rank's pieces to
//   host memory (CUDA: pinned memory, on a side stream ordered after the current stream; CPU: a
//   clone) and returns. The pieces' tensors may be freed by the caller at once; their values
//   must not change until beforeUpdate() (CUDA) — the copies may still be reading them.
// - The writer thread writes this rank's shard, then tells rank 0 through `store` (a key per
//   rank); rank 0's writer waits for every rank's key (at most `timeout`, then an error naming
//   the ranks whose shards are missing), writes metadata.pt and renames. Keys live under
//   "checkpoint/" in `store` and are deleted once published. `store` must be thread-safe
//   (c10d::TCPStore is) and shared by every rank of `comm` (the world's store).
// - beforeUpdate(), poll(): local, never block the host (beforeUpdate orders the current CUDA
//   stream after the copies). wait(): local, blocks until this rank's part of the save in
//   flight is done (rank 0: published) and rethrows its error.
// - The destructor waits for the save in flight and logs (does not throw) its error.
// - Not thread-safe: one caller thread.
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/store.h"

namespace tessera::checkpoint {

class HostStage;

class AsyncSaver {
 public:
  AsyncSaver(CommPtr comm, StorePtr store, std::chrono::milliseconds timeout);
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  void save(const std::string& dir, const std::vector<Piece>& pieces, int64_t step,
            const std::map<std::string, std::string>& extra = {}, const std::map<std::string, std::string>& files = {});
  void beforeUpdate();
  void poll();
  void wait();

 private:
  void write(std::string dir, int64_t step, std::map<std::string, std::string> extra,
             std::map<std::string, std::string> files, uint64_t seq);

  CommPtr comm_;
  StorePtr store_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  std::thread writer_;
  std::shared_ptr<std::atomic<bool>> done_;
  std::exception_ptr error_;
  std::unique_ptr<HostStage> stage_;
  // The save in flight: what the writer writes.
  struct Pending;
  std::unique_ptr<Pending> pending_;
};

}  // namespace tessera::checkpoint
