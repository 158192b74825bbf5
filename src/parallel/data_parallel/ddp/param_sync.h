#pragma once
// Construction-time agreement of DDP ranks. Both functions are collective over `comm`.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"

namespace tessera::ddp {

// What one rank brings to DDP's construction (validate.h builds it).
struct RankState {
  std::string problem;               // why this rank cannot go on (bad option, no parameters...); "" if none
  std::vector<std::string> options;  // "name=value" for each option the ranks must share
  std::vector<std::string> params;   // one description per parameter, in order
  std::vector<std::string> buffers;  // one description per buffer, in order
};

// Throws the same tessera::Error on every rank when
// - any rank has a problem: "DistributedDataParallel: on rank 1: <problem>" (ranks with the
//   same problem are listed together: "on ranks 0, 1: ..."); else when
// - the ranks' options, parameters or buffers differ (checked in that order): the message
//   names the kind, the count per rank, the first differing entry and what every rank has
//   there ("(none)" past a rank's end).
// Returns normally on every rank otherwise. Two all-gathers when the ranks agree (a third
// one, of text, when they do not). Long texts are cut at 1023 characters in messages.
// `scratch` places the small exchange tensors where `comm` can send them.
void agree(Communicator& comm, const RankState& mine, const at::TensorOptions& scratch);

// "'name' [sizes] dtype", then " (cuda)" off the CPU and " requires_grad=false" for a
// tensor that does not require a gradient when `withGrad`.
std::string describeTensor(const std::string& name, const at::Tensor& t, bool withGrad);

// agree() on the parameters alone (described with requires_grad), for callers other than
// DDP's constructor (FSDP): the same errors, naming the first differing parameter.
void checkSameParameters(Communicator& comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const at::TensorOptions& scratch);

// Collective over `comm`: copies rank `root`'s tensors into every rank's (in place). Tensors of one
// dtype are broadcast in buckets of consecutive tensors of at most bucketBytes (one staging copy
// of at most that size); a tensor of bucketBytes or more is broadcast alone, in place when
// contiguous. Every rank must pass the same sizes and dtypes in the same order (the callers agree
// on them first): the buckets follow from those alone. A whole model staged in one buffer doubled
// the build's memory (llama3-8b under FSDP: 59.8 GiB on each GPU).
void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, int root,
                      size_t bucketBytes = size_t{256} << 20);

}  // namespace tessera::ddp
