#pragma once
// Internal to data_parallel/: the wrappers behind replicate() and shard() (data_parallel.h).
// replicated / sharded: one wrapper over every parameter of `chunks` on `group`. splitExperts: the
// parameters marked `expert` trained by a second wrapper of the same kind over o.expertData, the
// rest by one over `group` (experts.cpp); splitsExperts says when replicate() and shard() use it
// (o.ep of more than one rank and expert parameters on this rank; equal on a data group, whose
// ranks hold the same pipeline stage). Construction is collective as the wrappers' are.
#include <memory>

#include "tessera/parallel/data_parallel/data_parallel.h"

namespace tessera::dp {

std::unique_ptr<DataParallel> replicated(const ModelChunks& chunks, CommPtr group, DataParallelOptions o);
std::unique_ptr<DataParallel> sharded(const ModelChunks& chunks, CommPtr group, DataParallelOptions o);
bool splitsExperts(const ModelChunks& chunks, const DataParallelOptions& o);
std::unique_ptr<DataParallel> splitExperts(const ModelChunks& chunks, CommPtr group, DataParallelOptions o,
                                           bool sharded);

}  // namespace tessera::dp
