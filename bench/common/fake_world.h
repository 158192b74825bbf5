#pragma once
// TESSERA_FAKE_WORLD=N (N >= 2): a one-GPU probe of what a data/tensor/fully-sharded parallel step
// costs on each GPU when communication is free. One process plays rank 0 of an N-rank world on its
// device (LOCAL_RANK, default 0) over tessera's fake communicator (src/comm/fake: no data moves,
// every op complete when issued, outputs hold realistic values). Everything else — the sharded or
// split model, the DDP/FSDP machinery (bucket copies, casts, hooks, allocations) — runs as rank 0
// of N would run it. PyTorch's counterpart is its "fake" process group (bench/torch_anchor.py
// reads TESSERA_FAKE_WORLD too).
// What the probe gives: the step time and peak memory of one rank without communication, so
//   step(2 GPUs, real) − step(probe) = exposed communication + the slowdown of kernels that share
//   the GPU with NCCL's, and  step(probe) − step(1 GPU, same per-GPU work) = the cost of the
//   parallel machinery itself, measurable without a second GPU. The fake all-gathers and
//   reduce-scatters copy on the compute stream, so the probe overstates the machinery by the
//   time of those copies.
// TESSERA_FAKE_COMM_TIMED=1 gives the ops a modelled network's duration on a stream of their own
// (src/comm/fake/fake_timing.h): an emulation of the real run's schedule (overlap, waits, buffer
// lifetimes) without its contention for memory bandwidth; rows are then named "-emulated".
// Losses and parameters are meaningless (NaN-free, not a real run's). Pipeline parallelism is not
// covered (a stage's peer does not exist; tessera_bench_pp --emulate predicts it instead).
// The drivers read these variables once, at the top of main; the library reads none of them.
#include <string>

#include "tessera/comm/bootstrap/init.h"
#include "comm/fake/fake_timing.h"

namespace tessera::bench {

struct FakeWorld {
  int size = 0;       // 0: a real run
  FakeTiming timing;  // untimed: every op complete when issued
  // The rows' mark: "-nocomm", "-emulated" or "-emulated-keepdone" (timing.ignoreByCaller); "" for a real run.
  std::string systemSuffix() const;
};

// The fake timing: enabled by TESSERA_FAKE_COMM_TIMED=1 (0 or unset: untimed), its model from
//   TESSERA_FAKE_COMM_BUSBW_GBPS (every op's bus bandwidth), _LATENCY_US, _CTAS (SMs the emulated
//   collective holds; 0: none), _TRAFFIC=0|1 (those SMs stream memory; needs _CTAS),
//   _KEEP=done|contract (done: keep every op's tensors until it completes, ignoring Keep::ByCaller).
// (the model is read also when untimed: tessera_bench_pp --emulate prices its transfers with it).
// A malformed value is a tessera::Error naming the variable.
FakeTiming fakeTimingFromEnv();
// TESSERA_FAKE_WORLD (unset, empty or 0: none; 1 is an error) and fakeTimingFromEnv(). The
// variables' old names (FAKE_WORLD, FAKE_COMM_*, PP_EMULATE) are refused, naming the new ones.
FakeWorld fakeWorldFromEnv();
// tessera::init(), or for a fake world a Context whose world is the fake communicator (rank 0 of
// fake.size, device LOCAL_RANK or the CPU, no store): what every parallel bench binary starts with.
Context initWorld(const FakeWorld& fake);

}  // namespace tessera::bench
