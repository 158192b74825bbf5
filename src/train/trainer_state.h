#pragma once
// Trainer internals shared by trainer.cpp (construction, fit), trainer_step.cpp (one step),
// run_log.cpp (progress and JSONL log), checkpointing.cpp and hf_io.cpp.
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/checkpoint/async_save.h"
#include "tessera/common/host_sync.h"
#include "tessera/parallel/grad_norm.h"
#include "train/batches.h"
#include "tessera/train/parallelize.h"
#include "tessera/train/trainer.h"

namespace tessera::train {

using Clock = std::chrono::steady_clock;
inline double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Trainer::State {
  Config o;
  Context ctx;
  at::Device device = at::kCPU;
  Parallel par;
  std::unique_ptr<Batches> batches;
  std::unique_ptr<checkpoint::AsyncSaver> saver;  // --async-checkpoint
  int64_t startStep = 0, stepsDone = 0;
  std::string resumedFrom;  // the checkpoint directory a resumed run loaded (else empty)
  std::string lastCheckpoint;  // the newest checkpoint this run loaded or saved (else empty)
  int skippedInARow = 0;       // --nan-policy skip-step: updates skipped since the last finite step
  bool dpDescribed = false;
  // The Hugging Face model this run descends from (--init-from-hf, or the checkpoint's extra): its
  // config.json text and directory, kept in checkpoints and used by the HF exports.
  std::string hfConfig, hfSource;

  // Backward timings of the current step (breakdown, or the CPU).
  Clock::time_point backwardStart;
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

  // Rank 0's logs.
  std::ofstream jsonl;
  bool logOpened = false;
  Clock::time_point runStart = Clock::now();

  // One step: queueStep queues its work; finishStep reads its results back (on GPUs the loss,
  // gradient norm, peaks and FP8 counts in one copy after the step's last kernel) and completes
  // its report. Without --breakdown the host does not wait for the device in queueStep.
  struct Pending {
    StepReport rep;                      // the host's fields: step, lr
    std::shared_ptr<StreamMarks> marks;  // the step's start, its pipeline's end, the optimizer's end, its end
    Readback values;                     // float: loss, grad norm, peak, the five memory phases
    Readback fp8;                        // --fp8: int64 {values, underflows, saturated} over the world
    Readback moe;                        // MoE: moe_stats.cpp's figures over the world
  };
  Pending queueStep(const data::TokenBatch& batch);
  StepReport finishStep(Pending& p);
  // --nan-policy stop: a report with a non-finite loss or norm ends the run (NonFiniteError, the same
  // on every rank: the flag is the world's). Called once the report is logged.
  void stopIfNonFinite(const StepReport& r) const;
  // The optimizer step, or with --nan-policy skip-step and a non-finite flag anywhere (`nonFinite`:
  // this rank's), the gradients dropped; too many skips in a row end the run (NonFiniteError).
  void update(Pending& p, const at::Tensor& nonFinite, const GradNormClip& clip);
  // moe_stats.cpp, after the update: the step's routing figures queued (collective over the world,
  // no host wait), then the MoE layers' selection biases moved by the step's expert loads
  // (models/moe.h; biasUpdateRate). readMoeStats: the figures into the report (< 0: a dense model).
  void afterUpdateMoe(Pending& p);
  // Returns the loads per sparse layer [layers, E] float32, summed over the routing groups (undefined: none).
  at::Tensor queueMoeStats(Pending& p);
  void readMoeStats(Pending& p, StepReport& rep);
  std::string keptCheckpoint() const;  // what a stopped run says of its last checkpoint
  // The last finished step's marks when the device went on from its end to the next step (no
  // validation, checkpoint or export between): a step's time runs from that end to its own.
  std::shared_ptr<StreamMarks> previousEnd;
  // The pipeline table's idle share on this pp rank (the schedule's cost simulation, set at construction).
  double bubbleShare = 0;
  bool deferReports() const;  // GPUs without --breakdown: a step is finished after the next is queued

  State(Config c, const Context& context);
  bool isLogger() const { return ctx.world->rank() == 0; }
  // GPUs: logs the peak of building the model (and loading a checkpoint), then resets the
  // allocator's peak, so that the steps' peak_mem_gib is training's own. Before the first step.
  void startTrainingMemory();
  bool measureMemory() const;
  double endMemoryPhase();  // the peak since the last phase ended (folded into runPeakGiB), then resets it
  // run_log.cpp. Rank 0: the JSONL log; a resumed run keeps the records up to its checkpoint's step,
  // drops the later ones (a run killed after its last checkpoint) and appends a "resume" record.
  void openLog();
  void logStep(const StepReport& r);
  // Rank 0, at the end of fit(): what the run did (steps, losses, tokens, speed) and where its files
  // are, as log lines and a "summary" record.
  void logSummary(const std::vector<StepReport>& steps);
  // checkpointing.cpp
  void saveCheckpoint();
  bool loadCheckpoint();
  // A resume whose --steps stretches or shrinks a decaying LR schedule: said loudly (rank 0).
  void warnScheduleChange(const std::map<std::string, std::string>& extra) const;
  void adoptCheckpointBatch(const std::map<std::string, std::string>& extra, const std::string& dir);
  // hf_io.cpp: --init-from-hf, before the wrappers take the parameters; HF exports (collective).
  void initFromHf(std::vector<models::LmChunk>& chunks);
  void saveHf(const std::string& dir);
  double validationLoss();
};

}  // namespace tessera::train
