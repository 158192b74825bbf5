#pragma once
// Checkpoints saved while training goes on: the files, atomic publication and <dir>.old fallback of
// checkpoint::save (checkpoint.h), but the caller waits only while this rank's pieces are copied to
// host memory; a writer thread writes the shard, and rank 0's publishes the checkpoint.
// Collective: save() over `comm` (as checkpoint::save); the other methods are local. One save in
// flight per saver. The saver owns the host copies: the caller may free its tensors once save()
// returns, but on CUDA their values must not change before beforeUpdate().
// Streams: CUDA copies run on a side stream ordered after the caller's current stream.
// `store`: the world's store, shared by every rank of `comm` and thread-safe (c10d::TCPStore is);
// keys under "checkpoint/", deleted once published. Errors (tessera::Error): a failed save is thrown
// on its rank by the next save(), poll() or wait(); rank 0's names the ranks whose shards did not
// arrive within `timeout`. Not thread-safe: one caller thread. Design: docs/design/checkpoints.md.
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/store.h"

namespace tessera::checkpoint {

class HostStage;

// Example:
//   tessera::checkpoint::AsyncSaver saver(comm, ctx.store, std::chrono::minutes(10));
//   std::vector<tessera::checkpoint::Piece> pieces{tessera::checkpoint::whole("x", x)};
//   for (int step = 1; step <= steps; ++step) {
//     saver.beforeUpdate();  // before anything overwrites the saved tensors
//     x.add_(1);             // the update
//     if (step % 100 == 0) saver.save("ckpt", pieces, step);
//     saver.poll();          // a failed save ends the run at the next step
//   }
//   saver.wait();  // the last save is published (rank 0) before the end
class AsyncSaver {
 public:
  // `timeout`: how long rank 0's writer waits for every rank's shard.
  AsyncSaver(CommPtr comm, StorePtr store, std::chrono::milliseconds timeout);
  // Waits for the save in flight and logs (does not throw) its error.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective over `comm`: waits for this rank's previous save (throwing its error), agrees with the
  // other ranks who writes each replicated box, stages this rank's pieces in host memory and returns.
  // `extra` and `files` as checkpoint::save. `published`: run by rank 0's writer once the
  // checkpoint is published (series.h's commitStep, say); what it throws is the save's error.
  void save(const std::string& dir, const std::vector<Piece>& pieces, int64_t step,
            const std::map<std::string, std::string>& extra = {}, const std::map<std::string, std::string>& files = {},
            std::function<void()> published = {});
  // Local, no host wait: orders the current CUDA stream after the copies. Call it before anything
  // overwrites the saved tensors (the next optimizer step).
  void beforeUpdate();
  // Local, never blocks: when the save in flight has ended, finishes it and throws its error.
  void poll();
  // Local: blocks until this rank's part of the save in flight is done (rank 0: published); throws
  // its error.
  void wait();

 private:
  void write(std::string dir, int64_t step, std::map<std::string, std::string> extra,
             std::map<std::string, std::string> files, std::function<void()> published, uint64_t seq);

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
