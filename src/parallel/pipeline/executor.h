#pragma once
// PipelineExecutor: runs one schedule table (schedule.h) over this rank's stage chunks.
//
// step(input, target) is collective over the pp group: every pp rank calls it once per
// training step, in the same order. The batch is split along dim 0 into numMicro equal
// micro-batches; `input` is needed on the rank owning stage 0 (pp rank 0), `target` on the
// rank owning the last stage (pp rank pp − 1); other ranks may pass undefined tensors.
// Each micro-batch's loss is loss(output, target) / numMicro, so the gradients accumulated
// into the stages' parameters (never zeroed here) are those of the mean loss over the batch
// when `loss` is a mean over the micro-batch. Returns the mean loss (a float32 scalar on
// the executor's device) on every pp rank.
//
// Each step begins with one small all-reduce over the pp group (the preamble): the ranks'
// schedules, the input's shape and batch size, the target's batch size. Every rank then
// runs the same checks and, on a bad step, throws the same tessera::Error before any
// activation moves (batch not divisible into micro-batches, input/target sizes disagree,
// input or target or loss missing, ranks disagree on the schedule). The communicator is
// left usable.
// When the input's shape or dtype differs from the previous step's (or on the first step),
// the stages' activation shapes are re-learnt by a probe: micro-batch 0 runs forward under
// no_grad through the stages in order (stage s > 0 on zeros of the announced shape), each
// stage sending the next a shape header. A stage that fails on what it receives (e.g. a
// shape mismatch between stages) makes every rank throw an error naming that stage and
// the shape, again with the communicator usable. Stages must be deterministic in shape:
// an output whose shape or dtype differs from the probed one later is an error on the
// rank that produced it, naming both; its peers, waiting for that transfer, end with the
// communicator's error when that rank exits, or with its timeout while it lives on
// (test_pipeline checks both).
// Likewise any other failure inside the schedule (a stage throwing on micro-batch 3, out of
// memory): the failing rank throws "pipeline executor: forward of micro-batch 3 on stage 1
// (pp rank 1, chunk 0) failed: ..."; its peers end with a communication error when its
// process exits, at the latest after the communicator's timeout (test_pipeline checks it).
// The probe runs each stage's forward once more: a stage drawing random numbers (dropout)
// draws extra ones, and one with running statistics (batch norm) updates them, on the steps
// that probe. It neither reads nor fills CUDA autocast's cast cache (common/autocast.h's
// NoAutocastCache), so the step's forward makes its own casts. With pp > 1 on GPUs the preamble reads a few integers back to the host: on a side
// stream, so the host waits for the pp group's transfers queued before it (the previous step's
// last ones), not for this rank's compute stream; a SyncCheck (common/host_sync.h) lets that
// one round trip pass. With pp = 1 the preamble stays on the host. A probe reads back too.
//
// Communication: each Comm action of the table is posted as one batch when the rank reaches
// it, but the rank waits for a received activation (gradient) only right before the forward
// (backward) that uses it, and for its sends at the end of the step. So a stage computes
// whatever it already holds while its neighbours are still busy: with unbalanced stages and
// extra warm-up forwards (schedule.h) the faster stage does not hold the slower one back at
// every batch. On CUDA these waits are stream waits; the host never blocks on a transfer.
//
// A schedule that splits backward (ZB-H1): each Backward action runs autograd inside an
// nn::DeferWeightGrads scope (nn/deferred_grads.h), so the tessera linears' weight-gradient
// GEMMs are recorded per (micro, chunk); the WeightGrad action runs them. .grad is therefore
// complete only when step() returns; beforeBackward/afterBackward surround B only (a
// data-parallel wrapper lifting noSync there would reduce before the W's: keep noSync and
// reduce after the step, as train_gpt does with DistributedDataParallel::reduceGradients).
//
// Memory (Megatron's discipline): a stage output, once sent, keeps only its autograd graph;
// its data is replaced by an empty tensor (the receiver has its own copy; backward runs
// from the saved output with the received gradient). This frees memory when the stage's
// last op does not save its own result for backward (true of a residual add or a Linear; a
// final tanh's backward keeps the result alive, whatever the executor drops).
// peakInFlight() counts the (micro, chunk) pairs between forward and backward (W when split:
// its recorded inputs stay alive until then): for 1F1B
// at most pp − rank (+ the extra warm-up, schedule.h); lastStats() also has the bytes of
// outputs the executor holds. These are the executor's tallies of its own walk of the table,
// not measurements; test_pipeline measures what is really alive (weak references to the
// storages of each micro-batch's saved activations, received input and sent output) and
// finds at most the table's in-flight micro-batches alive, and every sent output freed by
// its backward (on Gloo; on CUDA the communicator releases a sent tensor once the device
// has passed the send).
#include <ATen/ATen.h>

#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct ExecutorOptions {
  at::Device device = at::kCPU;  // where activations, gradients, headers and the loss live
  bool freeSentOutputs = true;    // Megatron's deallocate_output_tensor
  // Called on this rank around each backward of the step (micro-batch, chunk, and whether it
  // is this rank's last backward of the step). Data-parallel wrappers use it to synchronise
  // gradients in the last backward only (DDP/FSDP noSync for the others), so the reduction
  // overlaps that backward; timers use it to measure. Exceptions propagate out of step().
  std::function<void(int micro, int chunk, bool lastBackward)> beforeBackward, afterBackward;
};

struct StepStats {
  int peakInFlight = 0;          // (micro, chunk) pairs between forward and backward
  int64_t peakOutputBytes = 0;   // bytes of stage outputs held by the executor
  int freedOutputs = 0;          // outputs whose data was freed after their send
  bool probed = false;           // this step re-learnt the activation shapes
};

class PipelineExecutor {
 public:
  using ChunkFn = std::function<at::Tensor(const at::Tensor&)>;
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  // `chunks[c]`: this rank's chunk c (stage schedule.stageOf(rank, c)); `loss`: needed on
  // the rank owning the last stage. Local (no communication); throws when the schedule's pp
  // differs from the group's size or the number of chunks disagrees.
  PipelineExecutor(CommPtr ppGroup, Schedule schedule, std::vector<ChunkFn> chunks, LossFn loss,
                   ExecutorOptions opts = {});
  ~PipelineExecutor();

  at::Tensor step(const at::Tensor& input, const at::Tensor& target);
  // Forward only (validation), under no_grad: the micro-batches run through the stages one
  // after another (no schedule, no backward, no gradients touched); returns the mean loss on
  // every pp rank. Collective over the pp group like step(), with the same preamble and probe.
  at::Tensor evaluate(const at::Tensor& input, const at::Tensor& target);

  const Schedule& schedule() const { return sched_; }
  const StepStats& lastStats() const { return stats_; }
  int peakInFlight() const { return stats_.peakInFlight; }
  int probes() const { return probes_; }

 private:
  // Returns the input's signature (dtype, ndim, dims).
  std::vector<int64_t> preamble(const at::Tensor& input, const at::Tensor& target);
  void probe(const at::Tensor& input0, const at::Tensor& target0);
  void run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets, at::Tensor& lossSum);
  int rank() const;

  CommPtr group_;
  Schedule sched_;
  std::vector<ChunkFn> chunks_;
  LossFn loss_;
  ExecutorOptions opts_;
  std::unique_ptr<StageP2P> p2p_;
  std::vector<TensorMeta> inMeta_, outMeta_;  // per chunk, from the last probe
  std::vector<int64_t> signature_;            // input shape + dtype of the last probe
  StepStats stats_;
  int probes_ = 0;
  std::optional<c10::Stream> preambleStream_;  // CUDA, pp > 1
};

}  // namespace tessera::pipeline
