#include "tessera/checkpoint/async_save.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>

#include "checkpoint/save_steps.h"
#include "checkpoint/staging.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera::checkpoint {

struct AsyncSaver::Pending {
  detail::ShardPlan plan;
  std::vector<at::Tensor> host;
};

namespace {
std::string writtenKey(uint64_t seq, int rank) { return fmt::format("checkpoint/{}/written/{}", seq, rank); }
}  // namespace

AsyncSaver::AsyncSaver(CommPtr comm, StorePtr store, std::chrono::milliseconds timeout)
    : comm_(std::move(comm)), store_(std::move(store)), timeout_(timeout) {
  TESSERA_CHECK(comm_ && store_, "checkpoint: AsyncSaver needs a communicator and the world's store");
}

AsyncSaver::~AsyncSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::error("checkpoint: the last asynchronous save failed: {}", e.what());
  }
}

void AsyncSaver::save(const std::string& dir, const std::vector<Piece>& pieces, int64_t step,
                      const std::map<std::string, std::string>& extra, const std::map<std::string, std::string>& files,
                      std::function<void()> published) {
  wait();  // one save in flight; rank 0's previous publication is done before its next plan
  auto pending = std::make_unique<Pending>();
  pending->plan = detail::plan(dir, pieces, *comm_);
  std::vector<at::Tensor> src;
  for (const auto& p : pending->plan.owned) src.push_back(p.local);
  stage_ = std::make_unique<HostStage>();
  pending->host = stage_->copy(src);
  // The writer needs the boxes (sizes, dtype), not the device tensors: the host copies stand in
  // for them (the stage keeps what its copies still read).
  for (size_t k = 0; k < pending->host.size(); ++k) pending->plan.owned[k].local = pending->host[k];
  pending_ = std::move(pending);
  done_ = std::make_shared<std::atomic<bool>>(false);
  writer_ = std::thread(&AsyncSaver::write, this, dir, step, extra, files, std::move(published), seq_++);
}

void AsyncSaver::write(std::string dir, int64_t step, std::map<std::string, std::string> extra,
                       std::map<std::string, std::string> files, std::function<void()> published, uint64_t seq) {
  auto done = done_;
  try {
    stage_->waitCopies();
    detail::writeShard(pending_->plan, pending_->host);
    pending_->host.clear();
    const int rank = pending_->plan.rank, world = pending_->plan.world;
    store_->set(writtenKey(seq, rank), std::vector<uint8_t>{1});
    if (rank == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back(writtenKey(seq, r));
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      while (!store_->check(keys)) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::vector<int> missing;
          for (int r = 0; r < world; ++r) {
            if (!store_->check({keys[r]})) missing.push_back(r);
          }
          throw Error(
              fmt::format("checkpoint: the asynchronous save of step {} to {}: ranks [{}] did not write their "
                          "shards within {} s; the previous checkpoint is kept",
                          step, dir, fmt::join(missing, ","), timeout_.count() / 1000.0));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      detail::publish(dir, world, step, extra, files);
      for (const auto& k : keys) store_->deleteKey(k);
      if (published) published();
    }
  } catch (...) {
    error_ = std::current_exception();
    detail::discard(dir);  // what this save wrote is no checkpoint: a failed save keeps no partial <dir>.tmp
  }
  done->store(true);
}

void AsyncSaver::beforeUpdate() {
  if (stage_) stage_->orderAfterCopies();
}

void AsyncSaver::poll() {
  if (!writer_.joinable() || !done_->load()) return;
  wait();
}

void AsyncSaver::wait() {
  if (writer_.joinable()) writer_.join();
  pending_.reset();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace tessera::checkpoint
