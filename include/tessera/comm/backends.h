#pragma once
// Factories of the concrete communicators. No Gloo, NCCL or CUDA type appears here.
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/comm/store.h"

namespace tessera {

bool glooAvailable();
// Collective over `size` processes that share `store` (keys are used under "gloo/<name>").
CommPtr makeGlooCommunicator(const StorePtr& store, int rank, int size, const std::string& name,
                             std::chrono::milliseconds timeout);

// True when tessera was built with NCCL (it may still find no GPU at run time).
bool ncclAvailable();
// "2.28.3" or "" when built without NCCL.
std::string ncclVersion();
// Collective over `size` processes: rank 0 makes the ncclUniqueId and shares it through
// `store`; non-blocking init, aborted with a clear error after `timeout`. `device` is the
// CUDA device index this process uses.
CommPtr makeNcclCommunicator(const StorePtr& store, int rank, int size, int device, const std::string& name,
                             std::chrono::milliseconds timeout);

// Process-wide backend options (configure() in comm/settings.h sets them): they apply to the
// communicators made afterwards. setGlooDevice: the interface name, else the host name or
// address, Gloo's TCP device binds (both empty: this host's name); ignored once the device
// exists (the first Gloo communicator) and in builds without Gloo. setNcclOptions: ops on a
// blocking twin communicator (blockingOps), NCCL's CTA policy, and whether each communicator's
// stream has the device's greatest priority (else the default one); throws tessera::Error for a
// policy this NCCL lacks (< 2.27); ignored in builds without NCCL.
void setGlooDevice(const std::string& ifname, const std::string& host);
void setNcclOptions(bool blockingOps, NcclCtaPolicy ctaPolicy, bool highPriorityStreams = true);

// CUDA device queries (0 / "" when built without CUDA or no driver is present).
int cudaDeviceCount();
std::string cudaPciBusId(int device);
void cudaSelectDevice(int device);

}  // namespace tessera
