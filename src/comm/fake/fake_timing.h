#pragma once
// Timing for the fake communicator (fake_communicator.h) on a CUDA device: an emulation of what
// the network would cost, for one-GPU studies of how a parallel step schedules its
// communication (what overlaps, what waits, how long buffers live) when no second GPU is at hand.
//
// With timing on, every op of the fake communicator runs on the communicator's own stream,
// ordered after the caller's current stream as NCCL's ops are: a kernel that spins for the op's
// modelled time, then the fake's output copies; Work::wait() makes the caller's stream wait on the
// op's end, synchronize() blocks the host. Tensors stay referenced until a poller thread sees the
// op complete (as NCCL's watchdog does), or not at all for Keep::ByCaller ops (types.h) unless
// `ignoreByCaller` (to emulate a communicator without that contract).
// Modelled time = latency + bytes moved / busbw, with nccl-tests' bus bandwidth definitions for a
// group of n: all-reduce 2(n−1)/n · bytes, all-gather / reduce-scatter / all-to-all (n−1)/n · bytes
// of the large side, broadcast / reduce / point-to-point the bytes themselves.
// What it leaves out: the network's contention with compute for memory bandwidth, and (unless
// `ctas` > 0) for SMs: NCCL's kernels occupy one SM per channel for the op's duration; with
// ctas > 0 the spin kernel takes that many whole SMs (all their shared memory), so GEMMs
// running beside it lose them as they would to NCCL. With `traffic` too, those SMs copy memory
// for the op's time instead of sleeping, so the op also costs memory bandwidth and power as
// NCCL's kernels do (an H200 training step runs at its 700 W cap, where more power drawn means
// lower clocks for the GEMMs beside it). NVLink's own power is still left out.
// Defaults: tessera's NCCL bus bandwidths on 2 × H200 (NV18) at 256 MiB
// (bench/results/collectives.md) and 12 µs latency (what 1 MiB all-reduce took there).
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

// Seconds an op of `kind` ("all_reduce", "all_gather", ... the OpInfo::op names) moving a buffer
// of `bytes` (the large side) costs in a group of `n` ranks under `t`.
double fakeOpSeconds(const FakeTiming& t, const std::string& kind, double bytes, int n);

}  // namespace tessera
