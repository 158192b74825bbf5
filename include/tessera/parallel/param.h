#pragma once
// What the parallel wrappers know of a model: its parameters under their unsharded names, with
// how each is replicated over tensor and pipeline parallelism (global gradient-norm clipping
// counts each element once: a replica's square is weighted 1/replicas; experts split over ep
// ranks are marked), and its parts, the
// pieces of its forward that data-parallel wrappers run as units. Plain data; local.
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace tessera {

struct NamedParam {
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
  // An MoE expert's weights split over an expert-parallel group (models/moe.h): other ep ranks
  // hold other experts, so data parallelism averages it over the expert-data group only.
  bool expert = false;
};

// A piece of a model's forward (a function of one tensor) and the parameters it owns; a part that
// owns none runs with those of part `sharesParamsOf` (a tied head on the embedding's stage).
struct ModelPart {
  std::string name;  // "emb", "block3", "head", ...
  std::function<at::Tensor(const at::Tensor&)> run;
  std::vector<NamedParam> params;
  int sharesParamsOf = -1;
};

}  // namespace tessera
