#pragma once
// tessera::FullyShardedDataParallel: parameters sharded over the ranks unit by unit, gathered just
// in time (with prefetch), gradients reduce-scattered as soon as a unit's backward produced them.
// - Construction is collective over `comm`: every rank passes the same units (else tessera::Error
//   naming the first difference); rank 0's values are broadcast (syncModuleStates). Each rank keeps
//   float32 master and gradient shards. Every parameter becomes a view of its unit's unsharded
//   buffer, which has no memory while the unit is sharded: do not touch a unit's parameters outside
//   runUnit (a tessera::Error where ATen checks; some kernels do not check and crash).
// - runUnit(u, x, fn) gathers u, runs fn and reshards u; u is gathered again for its backward. When
//   a synchronised backward returns, the gradient shards hold the average over the ranks (float32).
// - Every rank runs the same units in the same order; one backward per forward. Not thread-safe;
//   the object must outlive every backward over its units.
// - On CUDA the all-gathers and reduce-scatters run on the communicator's stream and the caller's
//   stream waits for them (no host sync). Why it is built so: docs/design/fsdp.md.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/data_parallel/fsdp/flat_param.h"
#include "tessera/parallel/data_parallel/fsdp/unit.h"

namespace tessera {

struct FsdpOptions {
  c10::ScalarType paramDtype = at::kFloat;   // gathered (compute) dtype: fp32, bf16, fp16
  c10::ScalarType reduceDtype = at::kFloat;  // gradients are reduce-scattered in this dtype
  bool reshardAfterForward = true;           // default for units that do not say
  // Bytes (paramDtype, padded) of unsharded parameters allowed alive at once counting
  // prefetches: prefetch goes as deep as this allows (autoPrefetchBudget, unit.h). 0: no prefetch.
  // A shard group of one never prefetches (nor gathers after the step): its gather is a local cast
  // on the compute stream, with no communication to hide, and a unit gathered early only holds memory.
  size_t prefetchBudgetBytes = 0;
  int shardGroupSize = 0;  // 0 or world size: plain FSDP; else hybrid (divides the world size)
  bool syncModuleStates = true;
  // ShardedAdamW::step updates the next forward's leading units (leadingUnits()) first and
  // all-gathers them while it updates the rest. They stay gathered until that forward runs them (or
  // reshardAll(); the state-dict loads reshard them first).
  bool gatherAfterStep = false;
  // For a tied table's untracked lookup (nn::embeddingAccumulateGrad): every trainable 2-D parameter
  // gets a row-gradient sink (nn/accum_embedding.h). In a synchronised backward the offered rows are
  // all-gathered over the world and added, divided by the world size, into this rank's shard after
  // its reduce-scatter (noSync: into the unit's accumulation); every rank must offer as many ids.
  // Units then reduce-scatter in the order their gradients were ready in rank 0's first synchronised
  // backward (reduceOrder()).
  bool gatherEmbeddingRows = false;
  // Every trainable parameter gets a gradient sink (nn/grad_sink.h): its range of the unit's float32
  // accumulation. Ops that sum weight gradients in the GEMM (accumulateGradInGemm layers, nn::
  // linearAccumulateGrad) add there directly, so those parameters get no paramDtype .grad and no
  // flattening; the buffer (unit-sized float32, allocated by the first such gradient) is what the unit
  // reduce-scatters, or what noSync keeps across micro-batches.
  bool accumulateGradInGemm = false;
};

// Instrumentation (local counters, reset by resetStats()).
struct FsdpStats {
  int unshardedUnits = 0;          // now: units gathered or being gathered
  int peakUnshardedUnits = 0;
  size_t unshardedBytes = 0;
  size_t peakUnshardedBytes = 0;
  int64_t allGathers = 0, prefetches = 0, reduceScatters = 0;
};

namespace fsdp {
struct Unit;
}

// Units: give a unit that runs more than once per forward (a root holding the embedding, run first,
// and the head, run last) reshardAfterForward = false; else it is gathered again for every run (the
// same results; FSDP warns once). Several micro-batches' forwards may run before their backwards
// (F0 F1 B0 F2 B1 ...), one backward call each: use noSync for all but the last. For a module that
// keeps its blocks in an nn::Blocks, fullyShard (fully_shard.h) makes these units itself.
// Example:
//   torch::nn::Embedding emb(32, 8);
//   torch::nn::Linear fc(8, 8), head(8, 32);
//   std::vector<tessera::FsdpUnitSpec> units = {
//       {"root", {{"emb.weight", emb->weight}, {"head.weight", head->weight}, {"head.bias", head->bias}},
//        /*reshardAfterForward=*/false},  // runs first and last: stays gathered through forward
//       {"fc", {{"fc.weight", fc->weight}, {"fc.bias", fc->bias}}}};
//   tessera::FullyShardedDataParallel fsdp(units, comm, {.paramDtype = at::kBFloat16});
//   tessera::ShardedAdamW opt(fsdp, {.lr = 3e-4});
//   auto forward = [&](const at::Tensor& ids) {  // every unit's forward inside its runUnit
//     at::Tensor h = fsdp.runUnit(0, ids, [&](const at::Tensor& t) { return emb(t); });
//     h = fsdp.runUnit(1, h, [&](const at::Tensor& a) { return torch::relu(fc(a)); });
//     return fsdp.runUnit(0, h, [&](const at::Tensor& a) { return head(a); });
//   };
//   for (int step = 0; step < steps; ++step) {
//     {
//       auto guard = fsdp.noSync();  // a first micro-batch: gradients kept locally, unsharded
//       lossFn(forward(tokens), targets).backward();
//     }
//     lossFn(forward(tokens), targets).backward();  // gradient shards: the average over the ranks
//     fsdp.clipGradNorm(1.0);                       // optional; collective
//     opt.step();
//     opt.zeroGrad();
//   }
class FullyShardedDataParallel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  using MultiFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  FullyShardedDataParallel(std::vector<FsdpUnitSpec> units, CommPtr comm, FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Collective over the shard group: gathers `unit` (waiting for its all-gather, issuing prefetches),
  // runs fn, then reshards the unit unless its reshardAfterForward is false. Nests only inside a unit
  // that does not reshard. Outputs that require grad gather the unit again before its backward.
  at::Tensor runUnit(size_t unit, const at::Tensor& input, const Fn& fn);
  std::vector<at::Tensor> runUnit(size_t unit, const std::vector<at::Tensor>& inputs, const MultiFn& fn);
  // Local: reshards every unit and ends the current pass (call it after a forward without
  // backward, e.g. evaluation under torch::NoGradGuard, which leaves non-resharding units
  // such as the root gathered).
  void reshardAll();
  // Local: the units the next forward gathers before its first compute, in order: the first unit
  // of the last finished pass, then those the prefetch budget gathers ahead of it. Empty before a
  // pass has finished, or with prefetch off.
  std::vector<int> leadingUnits() const;
  // Local: the units in the order the next synchronised backward reduce-scatters them: the order
  // agreed after the first synchronised backward (gatherEmbeddingRows), else the reverse of the last
  // finished forward's first runs. Empty before a pass has finished.
  std::vector<int> reduceOrder() const;
  // Collective over the shard group: all-gathers `units` now, asynchronously (gathered ones are
  // skipped), for the next forward to find them gathered. Not inside a pass (tessera::Error).
  void gatherForNextForward(const std::vector<int>& units);
  // Collective over the shard group: gathers every unit (in paramDtype), so that the parameters
  // hold their full values outside forward and backward (as FSDP's summon_full_params), e.g. to
  // take views of them for a checkpoint. Call reshardAll() afterwards. Not inside a pass.
  void unshardAll();

  class NoSync {
   public:
    explicit NoSync(FullyShardedDataParallel& f);
    ~NoSync();
    NoSync(const NoSync&) = delete;

   private:
    FullyShardedDataParallel& f_;
    bool prev_;
  };
  // While a NoSync lives, backward accumulates unsharded fp32 gradients locally (memory:
  // one full fp32 copy per unit); the next synchronised backward adds them in.
  NoSync noSync() { return NoSync(*this); }

  class KeepGathered {
   public:
    explicit KeepGathered(FullyShardedDataParallel& f);
    ~KeepGathered();  // reshards every unit (local)
    KeepGathered(const KeepGathered&) = delete;

   private:
    FullyShardedDataParallel& f_;
  };
  // While a KeepGathered lives, a unit once gathered stays gathered (no reshard after its forward or
  // backward) until the scope ends: a step's micro-batches then gather each unit once instead of twice
  // each (ZeRO-2's regime), at the memory of every unit gathered at once (paramDtype). Prefetch counts
  // kept units out of its budget. End it before the optimizer changes the master shards (ShardedAdamW
  // refuses to step inside it). One at a time (a second is a tessera::Error).
  KeepGathered keepGathered() { return KeepGathered(*this); }
  bool keepingGathered() const;

  // Local: releases the gradient shards (as zero_grad(set_to_none=True): they take no memory
  // until the next backward creates them) and drops accumulated noSync gradients.
  void zeroGrad();
  // Local: `views` (offset, leaf float32 tensor aliasing masterShard(u) from that element; else
  // tessera::Error naming the unit) get their range of gradShard(u) as .grad at the end of each
  // synchronised backward; the next backward adds into what their .grad then hold (None: zeros;
  // zeroGrad() sets None). For an optimizer of the caller's (Python). Replaces u's earlier views.
  void setGradViews(size_t u, std::vector<std::pair<int64_t, at::Tensor>> views);
  // Collective over the shard group: scales the gradient shards by min(1, maxNorm / (norm + 1e-6)) as
  // torch::nn::utils::clip_grad_norm_ and returns the norm before clipping (0-dim fp32, on the
  // shards' device; queued on the current stream, no host sync). maxNorm < 0 or NaN: tessera::Error;
  // infinity: the norm only.
  at::Tensor clipGradNorm(double maxNorm);

  // Sharded state, for the optimizer and checkpoints.
  size_t numUnits() const;
  const std::string& unitName(size_t u) const;
  const fsdp::FlatLayout& layout(size_t u) const;
  at::Tensor masterShard(size_t u) const;  // fp32 [shardNumel], this rank's shard
  at::Tensor gradShard(size_t u) const;    // fp32 [shardNumel]; fresh zeros when released
  int shardRank() const;
  // Collective over the shard group: unit u's flat buffer [paddedNumel] from every rank's `shard`
  // (this rank's part of it: any tensor of at most shardNumel elements, zero-padded; e.g. the
  // master shard or an optimizer's state of it), in its dtype and on its device.
  at::Tensor gatherFull(size_t u, const at::Tensor& shard) const;
  const CommPtr& shardGroup() const;
  const CommPtr& replicaGroup() const;  // null unless hybrid
  const CommPtr& world() const;

  // Full state dict: collective over the world; on world rank 0 every parameter by name
  // (fp32, full shape, fresh tensors on the parameters' device), empty on other ranks.
  std::map<std::string, at::Tensor> fullStateDict();
  // Collective over the world: rank 0's `sd` (must hold every parameter with its shape) is
  // broadcast and each rank keeps its shard; other ranks' `sd` is ignored. Both loads are
  // refused (tessera::Error naming the unit) while a unit is gathered (unshardAll, an evaluation
  // forward without reshardAll) or a forward's backward is still to come.
  void loadFullStateDict(const std::map<std::string, at::Tensor>& sd);
  // Local: "<unit>.flat_shard" -> clone of this rank's master shard, and "<unit>.layout" ->
  // int64 [numel, paddedNumel, shards, rank] to check on load.
  std::map<std::string, at::Tensor> shardedStateDict() const;
  // Local: loads what shardedStateDict saved on the same shard rank and layout (tessera::Error
  // naming the key otherwise).
  void loadShardedStateDict(const std::map<std::string, at::Tensor>& sd);

  const FsdpStats& stats() const;
  void resetStats();
  const FsdpOptions& options() const;

  struct Impl;  // internal (impl.h)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
