#pragma once
// A model parameter as the trainer sees it: its name in the unsharded model (checkpoints,
// weight-decay rules, FSDP units) and how it is replicated over tensor parallelism (global
// gradient-norm clipping counts each element once: a replica's square is weighted 1/replicas).
#include <ATen/core/Tensor.h>

#include <string>

namespace tessera::models {

struct ChunkParam {
  std::string name;  // e.g. "emb.weight", "blocks.3.wq.weight", "norm.weight", "head.weight"
  at::Tensor tensor;
  bool replicatedOverTp = false;  // the same on every tp rank (norms, row-parallel biases)
  // Elements [replicatedFrom, numel) (flat) are the same on `replicas` tp ranks (Llama's k/v
  // rows when tp > kv heads); -1: none beyond replicatedOverTp.
  int64_t replicatedFrom = -1;
  int replicas = 1;
  // Copies of this tensor on other pipeline stages (a tied embedding table on the first and
  // the last stage: 2): its gradient is summed over the embedding group and counted once.
  int ppCopies = 1;
};

}  // namespace tessera::models
