#pragma once
// tessera::FullyShardedDataParallel: parameters sharded over the ranks unit by unit, gathered
// just in time (with memory-budgeted prefetch), gradients reduce-scattered as soon as a
// unit's backward has produced them.
//
// Usage (every rank of `comm`, same model and units, different data):
//   std::vector<FsdpUnitSpec> units = {{"root", rootParams, /*reshardAfterForward=*/false}, ...};
//   FullyShardedDataParallel fsdp(units, comm, {.paramDtype = at::kBFloat16});
//   ShardedAdamW opt(fsdp, {.lr = 1e-3});
//   for (...) {
//     auto h = fsdp.runUnit(0, tokens, [&](const at::Tensor& t) { return embed(t); });
//     for (i...) h = fsdp.runUnit(1 + i, h, [&](const at::Tensor& x) { return blocks[i](x); });
//     auto logits = fsdp.runUnit(0, h, [&](const at::Tensor& x) { return head(x); });
//     lossFn(logits, y).backward();   // grad shards hold the average over ranks on return
//     fsdp.clipGradNorm(1.0);          // optional, collective; the norm as a device tensor
//     opt.step(); opt.zeroGrad();
//   }
//   { auto guard = fsdp.noSync(); ...forward/backward... }   // accumulate, no communication
//
// Contract:
// - Construction is collective over `comm`: every rank passes the same units (names, shapes,
//   dtypes; else tessera::Error naming the first difference); rank 0's values are broadcast
//   (syncModuleStates). Each unit's parameters are flattened (trainable, frozen, padding; see
//   flat_param.h) and split evenly over the shard group; the rank keeps its fp32 master shard
//   and an fp32 gradient shard. Every parameter tensor then becomes (set_data) a view of the
//   unit's unsharded buffer in paramDtype, whose storage is released while the unit is
//   sharded: do not touch a unit's parameters outside runUnit (they have no memory). Where ATen
//   checks (views, as linear's weight.t(): "out of bounds for storage of size 0"; data_ptr: "data
//   is not allocated") that is an error, a tessera::Error naming the running unit and the sharded
//   ones inside another unit's runUnit; some kernels do not check and read the null pointer (a
//   CPU sum of a sharded parameter crashed with SIGSEGV in LibTorch 1.13).
// - runUnit(u, x, fn) gathers unit u (waiting for its all-gather, issuing prefetches), runs
//   fn, and reshards u afterwards unless the unit's reshardAfterForward is false. Outputs that
//   require grad pass through an identity autograd node whose backward re-gathers u (and
//   prefetches) before u's backward runs. When every trainable parameter of u has its
//   gradient, the gradients are flattened (cast to reduceDtype, divided by the world size),
//   reduce-scattered, and u is resharded (units holding frozen parameters stay unsharded until
//   the end of backward, since ops on frozen parameters may still need them). At the end of
//   backward every reduce-scatter is waited for and added (fp32) into the grad shards, and
//   every unit is resharded. Parameters of a unit that got no gradient contribute zeros.
// - Every rank must run the same units in the same order (all-gathers and reduce-scatters are
//   issued in that order); a unit may run several times per iteration (e.g. the root).
//   runUnit nests only inside a unit whose reshardAfterForward is false (a root unit wrapping
//   the whole forward, as the Python wrapper does). Not thread-safe; the FSDP object must
//   outlive every backward over its units. One backward per forward (no retain_graph re-runs).
//   Forwards of several micro-batches may run before their backwards, one backward call each
//   (pipeline schedules: F0 F1 B0 F2 B1 ...): each backward processes the units its graph
//   reaches; use noSync for all but the last.
// - Root unit: give a unit that runs more than once per forward (a root holding the embedding,
//   run first, and the head, run last) reshardAfterForward = false in its FsdpUnitSpec, as the
//   Usage above does and the Python wrapper does for its root. It is not automatic: FSDP only
//   knows a unit runs twice once it has. With resharding on, such a unit is all-gathered again for
//   every run, to save its memory in the middle of the forward only: in backward it stays
//   gathered from its first pre-backward hook to its last gradient. Results are the same. FSDP
//   warns (log::warn, once per unit, at the end of a backward) when a resharding unit ran more
//   often than other units in the forward that backward went through.
// - Hybrid sharding (shardGroupSize s < world): shard within groups of s consecutive ranks,
//   replicate across the world/s groups (gradient shards all-reduced across replicas).
// - Devices: CPU (Gloo) and CUDA (NCCL) through Communicator only. On CUDA, all-gathers and
//   reduce-scatters run on the communicator's stream; Work::wait() orders the caller's
//   current stream after them (no host sync). FSDP keeps their tensors itself (Keep::ByCaller)
//   and frees them stream-ordered, after the current stream waited: a gathered unit's buffers
//   when it reshards, a reduce-scatter's flat input (the unit's whole gradient in reduceDtype)
//   when the next unit's gradients are flattened, so one such input is alive at a time rather
//   than one per reduce-scatter the device has not finished when the host moves on.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/data_parallel/gathered_rows.h"
#include "parallel/data_parallel/fsdp/flat_param.h"
#include "parallel/data_parallel/fsdp/unit.h"

namespace tessera {

struct FsdpOptions {
  c10::ScalarType paramDtype = at::kFloat;   // gathered (compute) dtype: fp32, bf16, fp16
  c10::ScalarType reduceDtype = at::kFloat;  // gradients are reduce-scattered in this dtype
  bool reshardAfterForward = true;           // default for units that do not say
  // Bytes (paramDtype, padded) of unsharded parameters allowed alive at once counting
  // prefetches: prefetch goes as deep as this allows (see prefetch.h). 0: no prefetch.
  size_t prefetchBudgetBytes = 0;
  int shardGroupSize = 0;  // 0 or world size: plain FSDP; else hybrid (divides the world size)
  bool syncModuleStates = true;
  // ShardedAdamW::step updates the units the next forward starts with (leadingUnits()) first and
  // all-gathers them while it updates the rest, so that gather is not waited for at the next
  // step's start. They stay gathered until that forward runs them (or reshardAll(); the state-dict
  // loads reshard them first).
  bool gatherAfterStep = false;
  // Embedding rows gathered instead of reduce-scattered with the table (a tied table's lookup,
  // nn::embeddingAccumulateGrad untracked): every trainable 2-D parameter gets a row-gradient sink
  // (nn/accum_embedding.h). In a synchronised backward the rows a lookup offers are all-gathered
  // over the world (every rank's ids and rows; each rank's lookups must offer the same number of
  // ids) and added, divided by the world size, into this rank's shard of the parameter after its
  // reduce-scatter (and the replicas' all-reduce); under noSync they are summed into the unit's
  // unsharded accumulation. The table's unit then no longer waits for the lookup, the last op of
  // backward: from the second synchronised backward on, units reduce-scatter in the order their
  // gradients were ready in the first one on rank 0 (broadcast once), so a root holding a tied table
  // and the final norm goes first instead of last.
  bool gatherEmbeddingRows = false;
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

class FullyShardedDataParallel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  using Fn = std::function<at::Tensor(const at::Tensor&)>;
  using MultiFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  FullyShardedDataParallel(std::vector<FsdpUnitSpec> units, CommPtr comm, FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // Collective over the shard group (all-gathers) as described above.
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

  // Local: releases the gradient shards (as zero_grad(set_to_none=True): they take no memory
  // until the next backward creates them) and drops accumulated noSync gradients.
  void zeroGrad();
  // Local. Hands ranges of unit u's master shard to an optimizer of the caller's (the Python
  // module's torch.nn.Parameters, for any torch.optim): each view is a leaf float32 tensor
  // aliasing masterShard(u) from element `offset` on (else tessera::Error naming the unit).
  // From then on their .grad are the gradient shard: at the end of a synchronised backward each
  // view's .grad is its range of gradShard(u) (a view of it), and the next backward adds into
  // what the views' .grad say: a view whose .grad was set to None restarts its range at zero
  // (optimizer.zero_grad), one set to another tensor has it copied in. Replaces u's earlier
  // views; zeroGrad() sets their .grad to None.
  void setGradViews(size_t u, std::vector<std::pair<int64_t, at::Tensor>> views);
  // Collective over the world: total L2 norm of the model's gradient (all shards); multiplies the
  // shards by min(1, maxNorm / (norm + 1e-6)) (as torch::nn::utils::clip_grad_norm_; a factor of
  // exactly 1, leaving them unchanged, when the norm is below maxNorm). Returns the norm before
  // clipping as a 0-dim fp32 tensor on the shards' device. Nothing is read back to the host: on
  // CUDA the sum, the all-reduce (stream-ordered) and the scaling are queued on the current
  // stream; call .item() on the result only when the value is needed (that waits for the GPU).
  // maxNorm < 0 (or NaN) is an error; maxNorm = infinity only computes the norm.
  at::Tensor clipGradNorm(double maxNorm);

  // Sharded state, for the optimizer and checkpoints.
  size_t numUnits() const;
  const std::string& unitName(size_t u) const;
  const fsdp::FlatLayout& layout(size_t u) const;
  at::Tensor masterShard(size_t u) const;  // fp32 [shardNumel], this rank's shard
  at::Tensor gradShard(size_t u) const;    // fp32 [shardNumel]; fresh zeros when released
  int shardRank() const;
  const CommPtr& shardGroup() const { return shardComm_; }
  const CommPtr& replicaGroup() const { return replicaComm_; }  // null unless hybrid
  const CommPtr& world() const { return world_; }

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

  const FsdpStats& stats() const { return stats_; }
  void resetStats();
  const FsdpOptions& options() const { return opts_; }

  // Called by autograd hooks (internal).
  void onPreBackward(int u);
  void onGradReady(int u, int param);

 private:
  void gather(int u, bool prefetch);
  void waitGathered(int u);
  void reshard(int u);
  void prefetchAfter(const std::vector<int>& order, int u);
  void beginBackward();
  void warnRepeatedRuns();
  void checkLoadable(const char* fn) const;
  void dropGatheredAhead();
  void processGrads(int u);
  void drainReduceScatters(int current);
  void releaseReduceInputs(size_t keep);
  void launchReady();
  void finalizeBackward();
  void resetPass();
  // rows.cpp (gatherEmbeddingRows).
  void installRowSinks();
  void removeRowSinks();
  bool offerRows(int u, int entry, const at::Tensor& ids, const at::Tensor& rows);
  void addGatheredRows();
  void agreeReduceOrder();
  bool reshardsAfterForward(int u) const;

  CommPtr world_, shardComm_, replicaComm_;
  FsdpOptions opts_;
  std::vector<std::unique_ptr<fsdp::Unit>> units_;
  std::vector<size_t> unitBytes_;
  std::vector<bool> alive_;
  FsdpStats stats_;
  bool sync_ = true;
  int running_ = -1;
  // Iteration bookkeeping: first-run order of this pass, the last finished pass's order.
  std::vector<int> passOrder_, plannedOrder_, backwardOrder_;
  bool passOpen_ = false, inBackward_ = false;
  size_t nextLaunch_ = 0;
  // Reduce-scatter inputs still in flight, oldest first, with their ops (releaseReduceInputs).
  std::deque<std::pair<at::Tensor, WorkPtr>> reduceIns_;
  // gatherEmbeddingRows: the rows gathered in this backward; the units in the order their gradients
  // were ready in this backward, and the reduce order agreed after the first synchronised one.
  struct EntryRows {
    int unit = 0, entry = 0;  // entry: index into the unit's layout entries
    GatheredRows gathered;
  };
  std::vector<EntryRows> gathered_;
  std::vector<int> readyOrder_, agreedOrder_;  // agreedOrder_: empty until agreed
};

}  // namespace tessera
