#pragma once
// Internal: the state FSDP keeps per unit (fsdp.cpp, state_dict.cpp, hooks.cpp).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/work.h"
#include "tessera/parallel/data_parallel/fsdp/flat_param.h"

namespace tessera::fsdp {

struct Unit {
  enum class State { Sharded, Gathering, Unsharded };

  std::string name;
  FlatLayout layout;
  std::vector<at::Tensor> params;  // in the spec's order (after de-duplication)
  std::vector<std::string> names;
  bool hasFrozen = false;
  int trainable = 0;                  // number of trainable parameters
  bool reshardAfterForward = true;
  bool warnedRerun = false;  // the warning of warnRepeatedRuns was given for this unit

  at::Tensor full;    // [paddedNumel] paramDtype; storage released while sharded
  at::Tensor master;  // [shardNumel] fp32
  at::Tensor grad;    // [shardNumel] fp32
  at::Tensor accum;   // [paddedNumel] fp32 unsharded noSync gradients, or undefined

  State state = State::Sharded;
  bool gatheredAhead = false;  // by gatherForNextForward, not yet run by a forward
  bool kept = false;           // would have been resharded: kept gathered by a KeepGathered scope
  WorkPtr gatherWork;
  at::Tensor gatherIn;  // the cast shard being sent (kept until the gather is waited for)

  // Per backward pass.
  // Ran with outputs requiring grad, and a backward through them is still to come: set by a
  // forward, kept across backward passes while liveGraphs > 0 (a pipeline runs the forwards of
  // several micro-batches before their backwards, one backward call each).
  bool ranWithGrad = false;
  int liveGraphs = 0;  // forwards with grad whose pre-backward hook has not fired yet
  bool bwdPrefetched = false;  // its backward has issued its prefetches
  int bwdRuns = 0;             // pre-backward hooks fired in this backward: runs of its forward
  std::vector<bool> gotGrad;  // by param index
  int pending = 0;
  bool gradsReady = false, launched = false;
  WorkPtr rsWork;
  at::Tensor rsOut;  // [shardNumel] reduceDtype

  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;  // (accumulator, key)

  // setGradViews: (offset in the shard, leaf tensor aliasing master there) whose .grad is `grad`.
  std::vector<std::pair<int64_t, at::Tensor>> gradViews;
};

// grad_views.cpp. adoptViewGrads: before `grad` is read or added to, take what the views' .grad
// say (all undefined: released; one undefined: its range restarts at zero; another tensor:
// copied in). publishViewGrads: each view's .grad = its range of `grad` (undefined if released).
void adoptViewGrads(Unit& x);
void publishViewGrads(Unit& x);

}  // namespace tessera::fsdp
