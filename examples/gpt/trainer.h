#pragma once
// The 3D training loop of train_gpt: a dp × pp × tp mesh (tp fastest), this rank's pipeline
// chunks of the GPT or Llama (src/models/lm.h) built from TP layers over its tp group, run by the
// pipeline executor over its pp group, and DDP or FSDP over its dp group for each stage's own
// parameters. Composition:
// - Gradients are reduced over dp only, in each step's last backward on this rank (the
//   executor's beforeBackward hook lifts DDP's / FSDP's noSync there), so the reduction
//   overlaps that backward and the micro-batches before it accumulate locally.
// - Tied embeddings with pp > 1: the first and last stages' copies of the table have their
//   gradients summed over the embedding group before clipping (Megatron's embedding group).
// - Global gradient-norm clipping over all three axes (parallel/grad_norm.h): TP-replicated
//   parameters weighted 1/tp (replicated kv rows 1/replicas, the tied table's two copies 1/2),
//   FSDP shards summed over dp, DDP replicas not.
// - Learning rate from the schedule (optim/lr_schedule.h) at each step; AdamW without weight
//   decay on norms and biases (embeddings by option).
// - Validation (--eval-every): the mean loss of --eval-batches global batches of the validation
//   share, forward only through the pipeline (pipeline/executor.h evaluate), averaged over dp.
// - Data (batches.h): step s's global batch, dp rank d reading rows [d·B/dp, (d+1)·B/dp).
// - The loss is the mean over the global batch, averaged over dp, reported once (rank 0).
// Every rank constructs and runs the Trainer (collective over the world).
#include <memory>
#include <string>

#include "comm/bootstrap/init.h"
#include "options.h"

namespace tessera::gpt {

struct StepReport {
  int64_t step = 0;
  double loss = 0, gradNorm = 0;
  double stepMs = 0, pipelineMs = 0, optimizerMs = 0;
  double bubbleMsEst = 0, dpSyncMsEst = -1, computeMsEst = 0;  // dpSyncMsEst < 0: not measured
  double tokensPerS = 0, mfu = -1, peakMemGiB = 0;
  double lr = 0, validLoss = -1;  // validLoss < 0: not evaluated at this step
  // --fp8: the step's casts summed over the ranks (fp8::Counts); values < 0 without --fp8.
  int64_t fp8Values = -1, fp8Underflows = 0, fp8Saturated = 0;
  // --breakdown on GPUs, the fullest rank's GiB (< 0: not measured): allocated at the step's start
  // and before its first backward; the peak of the forward, the backward, the optimizer phase.
  double memStepStartGiB = -1, memBeforeBackwardGiB = -1, memPeakForwardGiB = -1, memPeakBackwardGiB = -1,
         memPeakOptimizerGiB = -1;
};

class Trainer {
 public:
  Trainer(TrainOptions o, const Context& ctx);
  ~Trainer();
  // Trains up to o.steps (from the checkpoint's step when <checkpointDir> holds one), logging
  // on rank 0 and writing the JSONL log. Returns the reports of the steps it ran.
  std::vector<StepReport> run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace tessera::gpt
