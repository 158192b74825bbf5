#include "comm/watchdog/watchdog.h"

#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/comm/communicator.h"
#include "comm/watchdog/board.h"
#include "comm/watchdog/flight_recorder.h"
#include "tessera/common/log.h"

namespace tessera::watchdog {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<Communicator>> comms;
  bool failed = false;
  bool exitOnError = true;
  std::chrono::milliseconds grace = std::chrono::seconds(5);
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: used from detached threads at exit
  return *r;
}

}  // namespace

void track(const std::shared_ptr<Communicator>& comm) {
  auto& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  std::vector<std::weak_ptr<Communicator>> live;
  for (auto& w : r.comms) {
    auto c = w.lock();
    if (c == comm) return;
    if (c) live.push_back(w);
  }
  live.push_back(comm);
  r.comms = std::move(live);
}

void setExitPolicy(bool exitOnError, std::chrono::milliseconds grace) {
  auto& r = registry();
  std::lock_guard<std::mutex> l(r.mu);
  r.exitOnError = exitOnError;
  r.grace = grace;
}

std::string withCause(const std::string& reason) {
  const std::string cause = board::explainCommFailure(reason);
  return cause.empty() ? reason : fmt::format("{}\n  cause: {}", reason, cause);
}

void onCommFailure(const std::string& reason, const void* from) {
  auto& r = registry();
  std::vector<std::shared_ptr<Communicator>> others;
  bool exitOnError = true;
  std::chrono::milliseconds grace{};
  {
    std::lock_guard<std::mutex> l(r.mu);
    exitOnError = r.exitOnError;
    grace = r.grace;
    if (r.failed) {
      log::warn("tessera watchdog: further failure: {}", reason);
      return;
    }
    r.failed = true;
    for (auto& w : r.comms) {
      auto c = w.lock();
      if (c && c.get() != from) others.push_back(std::move(c));
    }
  }
  log::error("tessera watchdog: communication failed: {}\n{}", reason, FlightRecorder::instance().dump());
  for (auto& c : others) c->abort(fmt::format("another communicator of this process failed: {}", reason));
  if (!exitOnError) return;
  std::thread([grace, reason] {
    std::this_thread::sleep_for(grace);
    log::error("tessera watchdog: the process is still running {:.1f} s after a communication failure; exiting "
               "with code {} (TESSERA_EXIT_ON_ERROR=0 disables this). Failure: {}",
               grace.count() / 1000.0, kExitCode, reason);
    std::_Exit(kExitCode);
  }).detach();
}

}  // namespace tessera::watchdog
