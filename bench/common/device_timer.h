#pragma once
// Time stamps on a device's work, for timing the parts of a step without synchronising between
// them: mark() records a point on the caller's current stream (a CUDA event; on the CPU the host
// clock, the CPU's ops being synchronous) and the host clock; after synchronize(), ms(a, b) is the
// device's time between two marks, hostMs(a, b) the host's. CUDA events need a build with NCCL
// (TESSERA_HAVE_NCCL, which brings CUDA); elsewhere a CUDA device is an error. Local; not thread-safe.
#include <ATen/ATen.h>

#include <chrono>
#include <vector>

namespace tessera::bench {

class DeviceTimer {
 public:
  explicit DeviceTimer(const at::Device& d);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  int mark();                  // index of the new mark
  double ms(int a, int b);     // between marks a and b (the device synchronised since b)
  double hostMs(int a, int b);  // host clock between the calls that made marks a and b: what the
                                // host spent issuing the work (the device's time when it is longer
                                // means the host ran ahead; shorter or equal, the host kept it waiting)
  void clear();                // forget the marks (keeps the events for reuse)

 private:
  at::Device device_;
  std::vector<void*> events_;  // cudaEvent_t, reused across clear()
  std::vector<std::chrono::steady_clock::time_point> host_;
  int used_ = 0;
};

}  // namespace tessera::bench
