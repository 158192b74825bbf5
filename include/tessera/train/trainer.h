#pragma once
// Trainer: a training run of a decoder-only LM from one Config, in any dp × pp × cp × tp layout with
// DDP or FSDP (parallelize.h), on the configured data, with AdamW, the LR schedule, clipping by the
// global norm, validation, sharded checkpoints that resume (and reshard) exactly, and Hugging Face
// import/export. Every method is collective over ctx.world: every rank constructs it and calls the
// same methods in the same order. Errors are tessera::Error (UsageError for a config that cannot run).
// Example:
//   auto cfg = tessera::train::Config::parse(argc, argv, tessera::train::Machine::detect());
//   tessera::train::Trainer trainer(cfg, ctx);
//   trainer.fit();  // or: restore(), then log(step()) in a loop of one's own, then save()
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/bootstrap/init.h"
#include "tessera/data/batch.h"
#include "tessera/train/config.h"

namespace tessera::train {

// A step whose loss or gradient norm is not finite ended the run (--nan-policy stop), or too many
// steps in a row were skipped (skip-step). Thrown alike on every rank; nothing is saved after it.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

struct StepReport {
  int64_t step = 0;  // 1-based: the steps done after this one
  double loss = 0, gradNorm = 0;
  double stepMs = 0, pipelineMs = 0, optimizerMs = 0;
  double bubbleMsEst = 0, dpSyncMsEst = -1, computeMsEst = 0;  // dpSyncMsEst < 0: not measured
  double tokensPerS = 0, mfu = -1, peakMemGiB = 0;
  double lr = 0, validLoss = -1;  // validLoss < 0: not evaluated at this step
  // The loss or the gradient norm was NaN or infinite on some rank; skipped: the update was not
  // applied (--nan-policy skip-step).
  bool nonFinite = false, skipped = false;
  // --fp8: the step's casts summed over the ranks (fp8::Counts); values < 0 without --fp8.
  int64_t fp8Values = -1, fp8Underflows = 0, fp8Saturated = 0;
  // MoE (< 0 for a dense model): the step's expert load over every rank's tokens, per sparse layer,
  // as max / mean and min / mean (the worst layers'); the share of assignments dropped (capacity);
  // the balance and z losses before their coefficients, averaged over layers and ranks.
  double moeLoadMax = -1, moeLoadMin = -1, moeDropped = -1, moeAuxLoss = -1, moeZLoss = -1;
  // --breakdown on GPUs, the fullest rank's GiB (< 0: not measured): allocated at the step's start
  // and before its first backward; the peak of the forward, the backward, the optimizer phase.
  double memStepStartGiB = -1, memBeforeBackwardGiB = -1, memPeakForwardGiB = -1, memPeakBackwardGiB = -1,
         memPeakOptimizerGiB = -1;
};

class Trainer {
 public:
  // Resolves `config` against the world (Config::resolve) if that was not done, builds the model
  // and its wrappers and opens the data. --init-from-hf's weights are loaded here.
  Trainer(Config config, const Context& ctx);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads the checkpoint in config.checkpoint.dir if it holds one (or <dir>.old after an interrupted
  // save): parameters, optimizer state, step and data position. Returns whether one was loaded.
  bool restore();
  // One step on the next global batch of the configured data. Waits for the device at its end
  // (fit() reads each step's results back while the next one runs instead).
  StepReport step();
  // One step on `batch`: this rank's rows of the global batch, [batch / dp, T / cp] tokens and
  // targets (pipeline stages other than the first and the last may pass empty tensors).
  StepReport step(const data::TokenBatch& batch);
  // The progress line (rank 0) and the JSONL record of a step, as fit() writes them (the log is
  // opened by the first call: a resumed run's records after its checkpoint are dropped).
  void log(const StepReport& report);
  double evaluate();                      // the mean validation loss of config.data.evalBatches batches
  void save();                            // a checkpoint of the steps done, to config.checkpoint.dir
  void exportHf(const std::string& dir);  // the model as a Hugging Face directory (Llama)
  // The configured run: restore(), steps up to config.optim.steps with the progress log (rank 0) and
  // the JSONL log, validation, checkpoints and exports as configured. onStep sees every report.
  std::vector<StepReport> fit(const std::function<void(const StepReport&)>& onStep = {});

  int64_t stepsDone() const;
  const Config& config() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace tessera::train
