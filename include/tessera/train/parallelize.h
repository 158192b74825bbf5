#pragma once
// parallelize: the one composer. From a resolved Config it builds this rank's part of the model for
// the dp × pp × cp × tp mesh (tensor and sequence parallel, context parallel, recompute, FP8 and the
// fused weight-gradient GEMMs set on the layers), wraps it for the data group (DDP or FSDP, with
// AdamW: parallel/data_parallel/data_parallel.h), and hands it to the pipeline executor with its
// schedule. Gradients are synchronised in each step's last backward on this rank (the executor's
// beforeBackward releases the wrapper's hold), or after a split backward (ZB-H1). Collective over
// ctx.world; the Parallel object owns everything it built.
#include <functional>
#include <memory>
#include <vector>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/models/lm.h"
#include "tessera/parallel/data_parallel/data_parallel.h"
#include "tessera/parallel/pipeline/executor.h"
#include "tessera/parallel/pipeline/partition.h"
#include "tessera/parallel/process_mesh.h"
#include "tessera/train/config.h"

namespace tessera::train {

struct Parallel {
  std::unique_ptr<ProcessMesh> mesh;
  pipeline::Partition partition;
  std::vector<models::LmChunk> chunks;  // this rank's: chunk c is stage c · pp + pp rank
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<pipeline::PipelineExecutor> pipeline;
  CommPtr embGroup;  // a tied table over pp > 1: this (dp, cp, tp) slot's first and last stage ranks
  bool fsdpKeptThroughStep = false;  // --fsdp-keep-gathered resolved: units gathered once per step
  bool fsdpShardedAccumulation = false;  // --fsdp-accumulate resolved: a reduce-scatter per micro-batch

  bool firstStage() const { return mesh->coord().pp == 0; }
  bool lastStage() const { return mesh->coord().pp == (partition.vShape ? 0 : mesh->ppSize() - 1); }  // ZB-V: rank 0
  std::vector<checkpoint::Piece> pieces() const;  // every chunk's checkpoint pieces
  // The tied table's gradient summed over the embedding group (pp > 1), before clipping. Collective.
  void syncTiedEmbeddings();
};

struct ParallelizeHooks {
  // Called with the chunks once built, before the data-parallel wrapper takes their parameters
  // (weights from a Hugging Face directory).
  std::function<void(std::vector<models::LmChunk>&)> onModel;
  // Around each backward of the pipeline (micro-batch, chunk, whether it is this rank's last of
  // the step), after the wrapper's release: timers and memory phases.
  std::function<void(int, int, bool)> beforeBackward, afterBackward;
};

Parallel parallelize(const Config& c, const Context& ctx, const ParallelizeHooks& hooks = {});

}  // namespace tessera::train
