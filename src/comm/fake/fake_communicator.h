#pragma once
// A communicator that moves no data: one process plays rank `rank` of a group of `size` on one
// device. Untimed, every op is complete when issued (Work::wait, synchronize and completed return at
// once); timed (fake_timing.h), it takes a modelled network's time on a stream of its own. For
// probes and single-device tests, not training; a group of size 1 is exact (every op the identity).
// Local: no other process takes part. Outputs hold realistic values, as if every rank were this one:
//   - all-gather repeats this rank's input in every slot; reduce-scatter keeps this rank's slot of
//     its input (one device copy per slot; untimed, on the caller's current stream);
//   - all-reduce (any op), broadcast, reduce, all-to-all, send/recv and barrier leave every tensor
//     as it is;
//   - split() forms groups as if every rank had passed this rank's (color, key): one group of all
//     ranks for color >= 0, this rank keeping its rank.
// Inputs are checked as every backend checks them (communicator.h); tensors must be on `device`.
// backend() says Nccl for a CUDA device, Gloo for the CPU. Why: docs/design/communication.md.
#include <string>

#include "tessera/comm/communicator.h"
#include "comm/fake/fake_timing.h"

namespace tessera {

// `timing` (fake_timing.h, CUDA devices only): ops take their modelled time on a stream of their
// own instead of being complete when issued; the values written are the same. Errors: a rank
// outside [0, size), timing enabled on a CPU device or failing validate().
CommPtr makeFakeCommunicator(int rank, int size, const at::Device& device, const std::string& name = "fake",
                             const FakeTiming& timing = {});

}  // namespace tessera
