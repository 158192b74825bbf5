#pragma once
// PipelineExecutor: runs one schedule table (schedule.h) over this rank's stage chunks.
// - step(input, target) is collective over the pp group: every pp rank calls it once per step, in
//   the same order. The batch splits along dim 0 into numMicro micro-batches; `input` is needed on
//   pp rank 0, `target` on pp rank pp − 1 (others may pass undefined tensors). Each micro-batch adds
//   the gradient of loss(output, target) / numMicro into the stages' .grad (never zeroed here).
//   Returns the mean loss (a float32 scalar on the executor's device) on every pp rank.
// - A bad step (batch not divisible, sizes that disagree, input, target or loss missing, ranks on
//   different schedules, a stage failing on the shapes it receives) is the same tessera::Error on
//   every rank before any activation moves; the communicator stays usable. A later failure throws
//   on its rank (naming micro-batch, stage, pp rank, chunk); its peers fail in communication.
// - A new input shape or dtype re-probes the stages' shapes: one more no-grad forward per stage.
//   Stages must be deterministic in shape (else tessera::Error on the rank that differs).
// - CUDA: transfers are waited for by stream waits, not on the host (but for the preamble's one read
//   with pp > 1, on a side stream, and a probe's). With a split backward (ZB-H1) .grad is complete
//   only when step() returns. Why it is built so: docs/design/pipeline.md.
#include <ATen/ATen.h>

#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/parallel/pipeline/p2p.h"
#include "tessera/parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct ExecutorOptions {
  at::Device device = at::kCPU;  // where activations, gradients, headers and the loss live
  bool freeSentOutputs = true;    // Megatron's deallocate_output_tensor
  // Called on this rank around each backward (B only, when split) of the step: micro-batch, chunk,
  // and whether it is this rank's last backward of the step (a data-parallel wrapper synchronises
  // there). Exceptions propagate out of step().
  std::function<void(int micro, int chunk, bool lastBackward)> beforeBackward, afterBackward;
};

struct StepStats {
  int peakInFlight = 0;          // (micro, chunk) pairs between forward and backward
  int64_t peakOutputBytes = 0;   // bytes of stage outputs held by the executor
  int freedOutputs = 0;          // outputs whose data was freed after their send
  bool probed = false;           // this step re-learnt the activation shapes
};

// Example:
//   // 2 pp ranks: stage 0 the embedding and the blocks, stage 1 the head.
//   const tessera::CommPtr& pp = mesh.ppGroup();
//   tessera::pipeline::PipelineExecutor::ChunkFn chunk = [&](const at::Tensor& h) { return model->head(h); };
//   if (pp->rank() == 0) chunk = [&](const at::Tensor& t) { return model->blocks->forward(model->emb(t)); };
//   tessera::pipeline::Schedule schedule =
//       tessera::pipeline::makeSchedule(tessera::pipeline::ScheduleKind::OneFOneB, pp->size(), /*numMicro=*/8);
//   tessera::pipeline::PipelineExecutor executor(pp, schedule, {chunk}, lossFn, {.device = ctx.device});
//   torch::optim::AdamW opt(model->parameters());  // steps the parameters this stage's chunk used
//   for (int step = 0; step < steps; ++step) {
//     at::Tensor loss = executor.step(tokens, targets);  // tokens used on pp rank 0, targets on the last
//     opt.step();                                        // .grad: the gradient of the mean loss
//     opt.zero_grad();
//   }
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
  struct Run;  // run.cpp: one step's walk of the table
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
