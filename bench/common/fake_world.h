#pragma once
// FAKE_WORLD=N (N >= 2): a one-GPU probe of what a data/tensor/fully-sharded parallel step costs
// on each GPU when communication is free. One process plays rank 0 of an N-rank world on its
// device (LOCAL_RANK, default 0) over tessera's fake communicator (src/comm/fake: no data moves,
// every op complete when issued, outputs hold realistic values). Everything else — the sharded or
// split model, the DDP/FSDP machinery (bucket copies, casts, hooks, allocations) — runs as rank 0
// of N would run it. PyTorch's counterpart is its "fake" process group (bench/torch_anchor.py
// reads FAKE_WORLD too).
// What the probe gives: the step time and peak memory of one rank without communication, so
//   step(2 GPUs, real) − step(probe) = exposed communication + the slowdown of kernels that share
//   the GPU with NCCL's, and  step(probe) − step(1 GPU, same per-GPU work) = the cost of the
//   parallel machinery itself, measurable without a second GPU. The fake all-gathers and
//   reduce-scatters copy on the compute stream, so the probe overstates the machinery by the
//   time of those copies (a device memcpy of each all-gather's output and reduce-scatter's slot).
// FAKE_COMM_TIMED=1 (src/comm/fake/fake_timing.h) gives the ops a modelled network's duration on a
// stream of their own: an emulation of the real run's schedule (overlap, waits, buffer lifetimes)
// without its contention for memory bandwidth; rows are then named "-emulated".
// Losses and parameters are meaningless (NaN-free, not a real run's). Pipeline parallelism is not
// covered (a stage's peer does not exist).
#include "comm/bootstrap/init.h"

namespace tessera::bench {

// FAKE_WORLD's value; 0 when unset or empty. A value below 2 is an error.
int fakeWorldSize();
// tessera::init(), or with FAKE_WORLD set a Context whose world is the fake communicator (rank 0,
// device LOCAL_RANK or the CPU, no store): what every parallel bench binary starts with.
Context initWorld();

}  // namespace tessera::bench
