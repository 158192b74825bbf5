#pragma once
// Timing for the fake communicator (fake_communicator.h) on a CUDA device: each op takes what a
// modelled network would, for one-GPU studies of how a parallel step schedules its communication.
// With timing on, every op runs on the communicator's own stream, ordered after the caller's current
// stream as NCCL's ops are: a kernel that spins for the op's modelled time, then the fake's output
// copies. Work::wait() makes the caller's stream wait on the op's end; synchronize() blocks the
// host. Tensors stay referenced until a poller thread sees the op complete, except those of
// Keep::ByCaller ops (types.h) unless `ignoreByCaller`.
// Modelled time = latency + bytes moved / bus bandwidth (fakeOpSeconds). Defaults: tessera's NCCL
// on 2 × H200 (bench/results/collectives.md). What the model leaves out, and what `ctas` and
// `traffic` add back: docs/design/communication.md.
#include <string>

namespace tessera {

struct FakeTiming {
  bool enabled = false;
  double latencyUs = 12;
  double allReduceGBps = 300, allGatherGBps = 255, reduceScatterGBps = 227, otherGBps = 255;
  int ctas = 0;                 // SMs the spin kernel occupies; 0: one tiny block (no SM taken)
  bool traffic = false;         // those SMs stream memory for the op's time (needs ctas > 0)
  bool ignoreByCaller = false;  // keep Keep::ByCaller ops' tensors too, until the op completes
  std::string describe() const;
};

// Checks an enabled timing: latency >= 0, every bandwidth > 0, ctas >= 0, traffic only with
// ctas > 0; else a tessera::Error naming the field and its value. makeFakeCommunicator calls it.
// (The benchmark drivers fill the struct from TESSERA_FAKE_COMM_*: bench/common/fake_world.h.)
void validate(const FakeTiming& t);

// Seconds an op of `kind` (the OpInfo::op names) on a buffer of `bytes` (the large side) costs in
// a group of `n`: latency + moved / GBps, moved by nccl-tests' bus bandwidth definitions (all-reduce
// 2(n−1)/n · bytes; all-gather, reduce-scatter, all-to-all (n−1)/n · bytes; barrier 0; others bytes).
double fakeOpSeconds(const FakeTiming& t, const std::string& kind, double bytes, int n);

}  // namespace tessera
