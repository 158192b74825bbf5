// PipelineExecutor: construction and the two calls, step and evaluate (executor.h); what the ranks
// agree on first is agreement.cpp's, the table's walk run.cpp's.
#include "tessera/parallel/pipeline/executor.h"

#include <ATen/core/grad_mode.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <optional>

#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"

namespace tessera::pipeline {


PipelineExecutor::PipelineExecutor(CommPtr ppGroup, Schedule schedule, std::vector<ChunkFn> chunks, LossFn loss,
                                   ExecutorOptions opts)
    : group_(std::move(ppGroup)), sched_(std::move(schedule)), chunks_(std::move(chunks)), loss_(std::move(loss)),
      opts_(opts) {
  TESSERA_CHECK(group_ != nullptr, "pipeline executor: no pp communicator");
  TESSERA_CHECK(sched_.pp == group_->size(), "pipeline executor: the schedule is for pp = {}, the group '{}' has {} ranks",
                sched_.pp, group_->name(), group_->size());
  TESSERA_CHECK(static_cast<int>(chunks_.size()) == sched_.chunks,
                "pipeline executor: pp rank {} has {} chunk functions, the schedule has {} chunks per rank", rank(),
                chunks_.size(), sched_.chunks);
  for (size_t c = 0; c < chunks_.size(); ++c)
    TESSERA_CHECK(chunks_[c] != nullptr, "pipeline executor: pp rank {}: chunk {} has no function", rank(), c);
  p2p_ = std::make_unique<StageP2P>(group_, opts_.device);
  inMeta_.resize(sched_.chunks);
  outMeta_.resize(sched_.chunks);
}

PipelineExecutor::~PipelineExecutor() = default;

int PipelineExecutor::rank() const { return group_->rank(); }

at::Tensor PipelineExecutor::step(const at::Tensor& input, const at::Tensor& target) {
  const int r = rank(), M = sched_.numMicro, last = sched_.lastStageRank();
  stats_ = {};
  auto sig = preamble(input, target);
  std::vector<at::Tensor> inputs, targets;
  if (r == 0) inputs = input.chunk(M, 0);
  if (r == last) targets = target.chunk(M, 0);
  if (sig != signature_) {
    signature_.clear();  // a failed probe is retried on the next step
    probe(r == 0 ? inputs[0] : at::Tensor(), r == last ? targets[0] : at::Tensor());
    signature_ = sig;
    ++probes_;
    stats_.probed = true;
  }
  auto lossSum = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(opts_.device));
  run(inputs, targets, lossSum);
  group_->broadcast(lossSum, last)->wait();
  return lossSum.reshape({});
}

at::Tensor PipelineExecutor::evaluate(const at::Tensor& input, const at::Tensor& target) {
  const int r = rank(), M = sched_.numMicro, last = sched_.lastStageRank();
  auto sig = preamble(input, target);
  std::vector<at::Tensor> inputs, targets;
  if (r == 0) inputs = input.chunk(M, 0);
  if (r == last) targets = target.chunk(M, 0);
  if (sig != signature_) {
    signature_.clear();
    probe(r == 0 ? inputs[0] : at::Tensor(), r == last ? targets[0] : at::Tensor());
    signature_ = sig;
    ++probes_;
  }
  at::NoGradGuard ng;
  auto lossSum = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(opts_.device));
  auto recvFrom = [&](int peer, const TensorMeta& meta) {
    return p2p_->exchange({{CommKind::RecvForward, meta, {}, "activation", peer}}).at(0);
  };
  at::Tensor held;
  for (int m = 0; m < M; ++m) {
    for (int c = 0; c < sched_.chunks; ++c) {
      const int s = sched_.stageOf(r, c);
      const bool first = s == 0, lastStage = s == sched_.numStages() - 1;
      // ZB-V: a stage's neighbours are by the stage (its turn, on this rank, is handed over in `held`).
      const int prevLocal = sched_.localPrevChunk(r, c), nextLocal = sched_.localNextChunk(r, c);
      at::Tensor x = first ? inputs[m] : prevLocal >= 0 ? held : recvFrom(sched_.rankOfStage(s - 1), inMeta_[c]);
      auto y = chunks_[c](x);
      if (lastStage) {
        lossSum += loss_(y, targets[m]).to(at::kFloat) / static_cast<double>(M);
      } else if (nextLocal >= 0) {
        held = y;
      } else {
        p2p_->exchange({{CommKind::SendForward, outMeta_[c], y, "activation", sched_.rankOfStage(s + 1)}});
      }
    }
  }
  group_->broadcast(lossSum, last)->wait();
  return lossSum.reshape({});
}

}  // namespace tessera::pipeline
