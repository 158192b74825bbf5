#pragma once
// Flight recorder: the last N collectives of every communicator of this process (op, group,
// sequence number, sizes, start time, state), kept so a failure can say what each group was
// doing. Process-wide and thread-safe. N: setCapacity() (Settings::flightRecorderSize; default
// 32, 0 = off).
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "tessera/comm/types.h"
#include "tessera/comm/work.h"

namespace tessera {

class FlightRecorder {
 public:
  static FlightRecorder& instance();

  // Records an op just issued on the communicator identified by `comm` (its address: group
  // names need not be unique across processes' sub-groups, addresses are within a process).
  void record(const void* comm, const OpInfo& info, const WorkPtr& work);
  // Oldest first, one line per op, grouped by communicator:
  //   group 'world' (rank 1 of 4): last 3 of 17 ops
  //     #15 all_reduce (1024 x float32, sum) started 2.1 s ago: completed
  //     #17 broadcast (4 x int64, root 0) started 0.3 s ago: pending
  std::string dump() const;
  // Ops kept per communicator from now on (the older ones beyond it are dropped).
  void setCapacity(size_t n);
  size_t capacity() const;

 private:
  FlightRecorder();
  struct Entry {
    OpInfo info;
    std::chrono::steady_clock::time_point start;
    std::weak_ptr<Work> work;
  };
  struct Ring {
    std::deque<Entry> entries;
    uint64_t total = 0;
  };
  size_t capacity_ = 32;
  mutable std::mutex mu_;
  std::map<const void*, Ring> rings_;
  std::deque<const void*> order_;  // communicators in first-use order (dump order)
};

}  // namespace tessera
