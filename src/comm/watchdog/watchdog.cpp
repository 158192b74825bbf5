#include "comm/watchdog/watchdog.h"

#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/watchdog/flight_recorder.h"
#include "common/env.h"
#include "common/log.h"

namespace tessera::watchdog {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<Communicator>> comms;
  bool failed = false;
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

void onCommFailure(const std::string& reason, const void* from) {
  auto& r = registry();
  std::vector<std::shared_ptr<Communicator>> others;
  {
    std::lock_guard<std::mutex> l(r.mu);
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
  if (env::getInt("TESSERA_EXIT_ON_ERROR").value_or(1) == 0) return;
  auto grace = env::getSeconds("TESSERA_EXIT_GRACE_S").value_or(std::chrono::seconds(5));
  std::thread([grace, reason] {
    std::this_thread::sleep_for(grace);
    log::error("tessera watchdog: the process is still running {:.1f} s after a communication failure; exiting "
               "with code {} (TESSERA_EXIT_ON_ERROR=0 disables this). Failure: {}",
               grace.count() / 1000.0, kExitCode, reason);
    std::_Exit(kExitCode);
  }).detach();
}

}  // namespace tessera::watchdog
