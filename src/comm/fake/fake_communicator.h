#pragma once
// A communicator that moves no data: one process plays rank `rank` of a group of `size` on one
// device, every op costs nothing on the network and is complete when issued (Work::wait,
// synchronize and completed return at once) — or, timed (fake_timing.h), takes the time a
// modelled network would on a stream of its own. PyTorch's "fake" process group is the same idea.
// For probes, not training: what a data/tensor/fully-sharded parallel step costs on one GPU
// without its communication (bench/common/fake_world.h, the TESSERA_FAKE_WORLD probe), and
// single-device tests of parallel ops whose result does not depend on the other ranks. A group of
// size 1 is exact (every op of one rank is the identity): the benchmarks' group of one.
// Values are not those of a real run, but every output holds realistic values, as if every rank
// were this one:
//   - all-gather repeats this rank's input in every slot; reduce-scatter keeps this rank's slot of
//     its input (one device copy per slot, on the caller's current stream);
//   - all-reduce leaves the tensor as it is (sum, avg, max, min alike: a sum is this rank's part);
//   - broadcast, reduce, all-to-all, send/recv and barrier leave every tensor as it is;
//   - split() forms groups as if every rank had passed this rank's (color, key): one group of
//     all ranks for color >= 0, this rank keeping its rank.
// Why values matter: on an H200 GEMMs over never-written memory (mostly zeros) ran up to 20%
// faster (less power), which made a probe that left outputs unwritten beat the 1-GPU run.
// Inputs are checked as every backend checks them (communicator.h); tensors must be on `device`.
// backend() says Nccl for a CUDA device, Gloo for the CPU (what code that asks would expect).
#include <string>

#include "comm/communicator.h"
#include "comm/fake/fake_timing.h"

namespace tessera {

// `timing` (fake_timing.h, CUDA devices only): ops take their modelled time on a stream of their
// own instead of being complete when issued; the values written are the same.
CommPtr makeFakeCommunicator(int rank, int size, const at::Device& device, const std::string& name = "fake",
                             const FakeTiming& timing = {});

}  // namespace tessera
