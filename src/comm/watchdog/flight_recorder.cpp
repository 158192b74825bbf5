#include "comm/watchdog/flight_recorder.h"

#include <fmt/format.h>


namespace tessera {

FlightRecorder& FlightRecorder::instance() {
  // Leaked: the NCCL watchdog threads are detached and may record or dump while the process
  // exits, after function-local statics are destroyed (seen on the GPU machine as map::at
  // thrown from a destroyed map, then std::terminate).
  static auto* r = new FlightRecorder();
  return *r;
}

FlightRecorder::FlightRecorder() = default;

void FlightRecorder::setCapacity(size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  capacity_ = n;
  for (auto& [comm, ring] : rings_) {
    while (ring.entries.size() > capacity_) ring.entries.pop_front();
  }
}

size_t FlightRecorder::capacity() const {
  std::lock_guard<std::mutex> l(mu_);
  return capacity_;
}

void FlightRecorder::record(const void* comm, const OpInfo& info, const WorkPtr& work) {
  std::lock_guard<std::mutex> l(mu_);
  if (capacity_ == 0) return;
  auto [it, fresh] = rings_.try_emplace(comm);
  if (fresh) order_.push_back(comm);
  auto& ring = it->second;
  ring.entries.push_back(Entry{info, std::chrono::steady_clock::now(), work});
  ++ring.total;
  while (ring.entries.size() > capacity_) ring.entries.pop_front();
}

std::string FlightRecorder::dump() const {
  std::lock_guard<std::mutex> l(mu_);
  if (capacity_ == 0) return "flight recorder off (TESSERA_FLIGHT_RECORDER_SIZE=0)";
  if (order_.empty()) return "flight recorder: no collective was issued by this process";
  auto now = std::chrono::steady_clock::now();
  std::string out = "flight recorder (last collectives of each group, oldest first):";
  for (const void* c : order_) {
    auto found = rings_.find(c);
    if (found == rings_.end() || found->second.entries.empty()) continue;
    const auto& ring = found->second;
    const auto& first = ring.entries.front().info;
    out += fmt::format("\n  group '{}' (rank {} of {}): last {} of {} ops", first.group, first.rank, first.groupSize,
                       ring.entries.size(), ring.total);
    for (const auto& e : ring.entries) {
      auto w = e.work.lock();
      const char* state = !w ? "released (finished)" : (w->completed() ? "completed" : "PENDING");
      out += fmt::format("\n    #{} {}{}{}{} started {:.1f} s ago: {}", e.info.seq, e.info.op,
                         e.info.detail.empty() ? "" : " (", e.info.detail, e.info.detail.empty() ? "" : ")",
                         std::chrono::duration<double>(now - e.start).count(), state);
    }
  }
  return out;
}

}  // namespace tessera
