#pragma once
// Construction-time agreement of DDP ranks. Both functions are collective over `comm`.
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace tessera::ddp {

// Throws tessera::Error on every rank when the ranks' parameter lists differ in count,
// names, shapes or dtypes, naming the first differing parameter and what each rank has.
// `scratch` places the small exchange tensors where `comm` can send them.
void checkSameParameters(Communicator& comm, const std::vector<std::pair<std::string, at::Tensor>>& params,
                         const at::TensorOptions& scratch);

// Copies rank `root`'s tensors into every rank's (in place), one broadcast per dtype.
void broadcastTensors(Communicator& comm, const std::vector<at::Tensor>& tensors, int root);

}  // namespace tessera::ddp
