#pragma once
// DataParallel: one interface over the two ways a model's chunks are trained over a data group,
// replicated (DDP, ddp/ddp.h, with AdamW over whole parameters) or sharded (FSDP, fsdp/fsdp.h, with
// ShardedAdamW), so a trainer never branches on which. It runs the chunks' parts, holds gradient
// synchronisation off for a step's micro-batches, steps the optimizer, and hands checkpoints and
// exports the parameters and optimizer state as boxes of the unsharded tensors. With expert
// parallelism (options.ep) the parameters marked `expert` go to a second wrapper of the same kind
// over options.expertData, the rest over the data group (experts.cpp). Construction and the steps
// are collective over the data group; part runs are collective as the wrapper's ops are.
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/communicator.h"
#include "tessera/optim/adamw.h"
#include "tessera/parallel/data_parallel/ddp/ddp.h"
#include "tessera/parallel/data_parallel/fsdp/fsdp.h"
#include "tessera/parallel/grad_norm.h"
#include "tessera/parallel/param.h"

namespace tessera {

// The model as the wrapper takes it: this rank's chunks (pipeline stages), each a list of parts.
using ModelChunks = std::vector<std::vector<ModelPart>>;

struct DataParallelOptions {
  AdamWOptions adam;
  std::function<bool(const std::string& name)> decays;  // weight decay by parameter name; null: all
  bool multiTensorAdam = false;                         // replicated: kernels/multi_tensor_adamw.h
  DdpOptions ddp;                                       // replicated
  FsdpOptions fsdp;                                     // sharded
  // Sharded: one unit per part that owns parameters, named "<chunkNames[c]>.<part>" (default
  // "chunk<c>"); parts kept gathered from their forward to their backward (a head, run last in
  // forward and first in backward; a part whose parameters a later part reuses is always kept).
  std::vector<std::string> chunkNames;
  std::function<bool(const ModelPart&)> keepGathered;
  bool autoPrefetchBudget = false;  // fsdp.prefetchBudgetBytes from the units (autoPrefetchBudget)
  // Sharded: hold() also keeps the units gathered until the step (FSDP's KeepGathered): a step's
  // micro-batches gather each unit once. Memory: every unit gathered at once.
  bool keepGatheredThroughStep = false;
  // Sharded: hold() keeps gradient synchronisation on, so every micro-batch's backward reduce-scatters
  // into the float32 shards (1/dp of the memory of noSync's unsharded float32 accumulation).
  bool reduceEveryMicroBatch = false;
  // Expert parallel (ProcessMesh::expertGroup / expertDataGroup): the ep ranks splitting the
  // experts, and the ranks of the data group holding the same experts as this one. Null: none.
  CommPtr ep, expertData;
};

// Checkpoint pieces of the model and its optimizer state (value, "optim.exp_avg.<name>",
// "optim.exp_avg_sq.<name>" per model piece, in the model pieces' boxes). load: fill `pieces`
// (checkpoint::load), then call commit(step), which hands them to the wrapper and the optimizer.
struct TrainingPieces {
  std::vector<checkpoint::Piece> pieces;
  std::function<void(int64_t step)> commit;
};

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  // Runs part `part` of chunk `chunk` on x (sharded: its unit gathered around it).
  virtual at::Tensor run(size_t chunk, size_t part, const at::Tensor& x) = 0;
  // Gradient synchronisation held off (noSync) until release(): local. With
  // keepGatheredThroughStep, the units gathered from hold() to step(), skipStep() or endForwardOnly();
  // with reduceEveryMicroBatch (sharded), nothing held off: held() still says hold() came last.
  virtual void hold() = 0;
  virtual void release() = 0;
  virtual bool held() const = 0;
  // After backwards whose weight gradients were finished later (a split backward, ZB-H1): reduces
  // what hold() kept local. Collective. Sharded: refused (it reduces inside backward).
  virtual void reduceHeld() = 0;
  // This rank's gradients as weighted pieces for the global norm (weights from NamedParam's
  // replication over tp, of size `tp`), and the group over which the pieces' squares are summed
  // (the data group for shards, the ep group for experts beside replicas; null: identical replicas).
  virtual std::vector<GradPiece> gradPieces(int tp) const = 0;
  virtual CommPtr normGroup() const = 0;
  // The gradient (shard) of part `part` of chunk `chunk`, which must own exactly one parameter (a
  // tied table's copy, summed over the pipeline's embedding group). Local.
  virtual at::Tensor partGrad(size_t chunk, size_t part) = 0;
  // The optimizer step at `lr` with the gradients scaled by `gradScale` (undefined: 1), then the
  // gradients zeroed. Collective over the data group where the wrapper gathers after the step.
  virtual void step(double lr, const at::Tensor& gradScale) = 0;
  // A skipped step (a non-finite gradient norm): the gradients zeroed as step() leaves them, no
  // update, the optimizer's step count unchanged. Local.
  virtual void skipStep() = 0;
  // After forwards without backward (validation): local.
  virtual void endForwardOnly() = 0;
  // Checkpoints. `modelPieces` returns the chunks' pieces, views of their parameters (called while
  // the parameters have their storage). The pieces to save (sharded: gathered over the data group,
  // collective) or to load into (local).
  using PieceSource = std::function<std::vector<checkpoint::Piece>()>;
  virtual std::vector<checkpoint::Piece> savePieces(const PieceSource& modelPieces) = 0;
  virtual TrainingPieces loadPieces(const PieceSource& modelPieces) = 0;
  // Exports: the pieces of the named unsharded tensors with the current values (sharded: their unit
  // gathered when first asked for; every rank of the data group must ask for the same names).
  using Lookup = std::function<std::vector<checkpoint::Piece>(const std::string& name)>;
  virtual Lookup exportLookup(const PieceSource& modelPieces) = 0;
  // What a log says of it once the first step has run (DDP: its buckets; FSDP: its units).
  virtual std::string describe() const = 0;
};

// FSDP's units of one chunk's parts: one per part that owns parameters, named "<prefix>.<part>"
// (kept gathered where keepGathered says); a part that shares another's parameters runs in that
// part's unit, which then stays gathered between the two. unitOf[k]: the unit part k runs in.
struct PartUnits {
  std::vector<FsdpUnitSpec> units;
  std::vector<size_t> unitOf;
};
PartUnits partUnits(const std::vector<ModelPart>& parts, const std::string& prefix,
                    const std::function<bool(const ModelPart&)>& keepGathered = nullptr);

std::unique_ptr<DataParallel> replicate(const ModelChunks& chunks, CommPtr group, DataParallelOptions o);
std::unique_ptr<DataParallel> shard(const ModelChunks& chunks, CommPtr group, DataParallelOptions o);

}  // namespace tessera
