#pragma once
// Trainer internals shared by trainer.cpp (setup, step), trainer_eval.cpp (validation, gradient
// pieces), trainer_io.cpp (log) and trainer_checkpoint.cpp (checkpoints).
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "batches.h"
#include "checkpoint/async_save.h"
#include "common/host_sync.h"
#include "models/lm.h"
#include "optim/adamw.h"
#include "parallel/ddp/ddp.h"
#include "parallel/grad_norm.h"
#include "parallel/process_mesh.h"
#include "pipeline/executor.h"
#include "sharding/fsdp/fsdp.h"
#include "sharding/fsdp/optimizer.h"
#include "trainer.h"

namespace tessera::gpt {

using models::ChunkParam;
using Clock = std::chrono::steady_clock;
inline double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Trainer::State {
  TrainOptions o;
  Context ctx;
  at::Device device = at::kCPU;
  std::unique_ptr<ProcessMesh> mesh;
  CommPtr embGroup;  // tied embeddings with pp > 1: this (dp, tp) slot's first and last stage ranks
  pipeline::Partition part;
  std::vector<models::LmChunk> chunks;  // this rank's chunks, chunk c = stage c · pp + pp rank
  std::vector<size_t> firstUnit;        // FSDP: index of chunk c's first unit
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::AdamW> adam;         // ddp mode
  std::unique_ptr<ShardedAdamW> shardedAdam;  // fsdp mode
  std::unique_ptr<pipeline::PipelineExecutor> exec;
  std::unique_ptr<Batches> batches;
  // Gradient sync off until this rank's last backward of the step.
  std::unique_ptr<DistributedDataParallel::NoSync> ddpNoSync;
  std::unique_ptr<FullyShardedDataParallel::NoSync> fsdpNoSync;
  // Backward timings of the current step (breakdown).
  std::chrono::steady_clock::time_point backwardStart;
  std::vector<double> backwardMs;
  double lastBackwardMs = 0;
  // --breakdown on GPUs: the allocator's bytes per phase of the current step (GiB, this rank):
  // allocated at the step's start and before its first backward; the peak of the forward (to the
  // first backward), of the backward (to the pipeline's end), of the optimizer. Each phase resets
  // the allocator's peak; runPeakGiB keeps the run's peak across those resets.
  struct MemoryPhases {
    double stepStart = -1, beforeBackward = -1, peakForward = -1, peakBackward = -1, peakOptimizer = -1;
  } mem;
  double runPeakGiB = 0;
  // GPUs: logs the peak of building the model (and loading a checkpoint), then resets the
  // allocator's peak, so that the steps' peak_mem_gib is training's own. Before the first step.
  void startTrainingMemory();
  bool measureMemory() const;
  double endMemoryPhase();  // the peak since the last phase ended (folded into runPeakGiB), then resets it
  // DDP: logs (rank 0) the buckets as the first synchronised backward's gradient-ready order left them:
  // how many, and the first and last bucket's parameters (whose all-reduces start first and last).
  void logDdpBuckets() const;
  std::ofstream jsonl;
  std::chrono::steady_clock::time_point runStart = std::chrono::steady_clock::now();
  int64_t startStep = 0;
  std::string resumedFrom;  // the checkpoint directory a resumed run loaded (else empty)
  std::unique_ptr<checkpoint::AsyncSaver> saver;  // --async-checkpoint
  // The Hugging Face model this run descends from (--init-from-hf, or the checkpoint's extra):
  // its config.json text and directory, kept in checkpoints and used by the HF exports.
  std::string hfConfig, hfSource;

  bool isLogger() const { return ctx.world->rank() == 0; }
  bool firstPp() const { return mesh->coord().pp == 0; }
  bool lastPp() const { return mesh->coord().pp == mesh->ppSize() - 1; }
  std::vector<ChunkParam> params() const;

  void build();
  void setFp8(models::LmChunkImpl& chunk);  // --fp8 on its blocks (trainer.cpp)
  // One step (trainer.cpp): queueStep queues its work; finishStep reads its results back (on
  // GPUs the loss, gradient norm, peaks and FP8 counts in one copy after the step's last kernel)
  // and completes its report. Without --breakdown the host does not wait for the device in
  // queueStep.
  struct Pending {
    StepReport rep;            // the host's fields: step, lr
    StreamMarks marks;         // the step's start, its pipeline's end, the optimizer's end
    Readback values;           // float: loss, grad norm, peak, the five memory phases
    Readback fp8;              // --fp8: int64 {values, underflows, saturated} over the world
    Clock::time_point queued;  // when the host began the step
  };
  Pending queueStep(int64_t s);
  StepReport finishStep(Pending& p);
  bool deferReports() const;  // GPUs without --breakdown: a step is finished after the next is queued
  std::optional<Clock::time_point> lastFinished;  // when the last finished step's results were in
  // trainer_eval.cpp
  std::vector<GradPiece> gradPieces() const;
  void syncTiedEmbeddings();  // sums the tied table's gradient over the embedding group
  double validationLoss();    // mean over o.evalBatches validation batches, all ranks
  // trainer_io.cpp, trainer_checkpoint.cpp
  // Rank 0: the JSONL log; a resumed run keeps the records up to its checkpoint's step, drops
  // the later ones (a run killed after its last checkpoint) and appends a "resume" record.
  void openLog();
  void logStep(const StepReport& r);
  void saveCheckpoint(int64_t step);
  // True when a checkpoint was found (at <dir>, or <dir>.old after a save interrupted between
  // its renames) and loaded: sets startStep and starts `batches` at its data position (else at
  // the start). Without --batch the run takes the checkpoint's global batch.
  bool loadCheckpoint();
  void adoptCheckpointBatch(const std::map<std::string, std::string>& extra, const std::string& dir);
  // trainer_hf.cpp. Before DDP/FSDP take the parameters: each rank fills its pieces from the HF
  // directory's slices (--init-from-hf).
  void initFromHf();
  // Collective over the world: the model into an HF directory (hf::exportLlamaLive); FSDP units
  // are all-gathered one at a time.
  void saveHf(const std::string& dir);
};

}  // namespace tessera::gpt
