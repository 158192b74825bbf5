// PipelineExecutor::run: walks this rank's schedule table (see executor.h for the contract).
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "common/error.h"
#include "nn/deferred_grads.h"
#include "parallel/pipeline/executor.h"

namespace tessera::pipeline {

namespace {
int64_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}
}  // namespace

void PipelineExecutor::run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                           at::Tensor& lossSum) {
  const int r = rank(), M = sched_.numMicro, V = sched_.chunks;
  auto grid = [&] { return std::vector<std::vector<at::Tensor>>(V, std::vector<at::Tensor>(M)); };
  // Per (chunk, micro): the stage input (a received leaf, or the micro-batch), the output kept
  // for backward (the scaled loss on the last stage), the received output gradient, the input
  // gradient to send.
  auto in = grid(), out = grid(), outGrad = grid(), inGrad = grid();
  // The batch each received input / output gradient arrives with: waited on (on CUDA, a
  // stream wait) just before the computation that uses it, so a rank computes whatever it
  // already has while its neighbours still work on what it receives next. Sends are waited
  // on at the end of the step only (their errors surface there at the latest).
  std::vector<std::vector<WorkPtr>> inWork(V, std::vector<WorkPtr>(M)), gradWork(V, std::vector<WorkPtr>(M));
  std::vector<WorkPtr> sends;
  // A split backward (ZB-H1): the weight-gradient work B deferred, per (chunk, micro), run by W.
  const bool split = sched_.splitsBackward();
  std::vector<std::vector<nn::WeightGradQueue>> deferred(V, std::vector<nn::WeightGradQueue>(M));
  auto arrived = [](WorkPtr& w) {
    if (w) w->wait();
    w.reset();
  };
  int inFlight = 0;
  int64_t held = 0;
  auto where = [&](const char* what, int m, int c) {
    return fmt::format("{} of micro-batch {} on stage {} (pp rank {}, chunk {})", what, m, sched_.stageOf(r, c), r, c);
  };

  const auto& table = sched_.ranks.at(r);
  size_t lastBackward = table.size();
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].kind == Action::Backward) lastBackward = i;
  }

  for (size_t tick = 0; tick < table.size(); ++tick) {
    const auto& a = table[tick];
    const int m = a.micro, c = a.chunk;
    if (a.kind == Action::Forward) {
      const bool first = sched_.isFirstStage(r, c), last = sched_.isLastStage(r, c);
      if (!first) arrived(inWork[c][m]);
      at::Tensor x = first ? inputs.at(m) : in[c][m];
      TESSERA_CHECK(x.defined(), "pipeline executor: {} has no input", where("forward", m, c));
      if (!first) x.requires_grad_(true);
      in[c][m] = x;
      at::Tensor y;
      try {
        y = chunks_[c](x);
        if (last) y = loss_(y, targets.at(m)) / static_cast<double>(M);
      } catch (const std::exception& e) {
        throw Error(fmt::format("pipeline executor: {} failed: {}", where("forward", m, c), e.what()));
      }
      if (last) lossSum.add_(y.detach().to(at::kFloat).reshape({1}));
      out[c][m] = y;
      held += bytesOf(y);
      stats_.peakOutputBytes = std::max(stats_.peakOutputBytes, held);
      stats_.peakInFlight = std::max(stats_.peakInFlight, ++inFlight);
    } else if (a.kind == Action::Backward) {
      const bool first = sched_.isFirstStage(r, c), last = sched_.isLastStage(r, c);
      auto& y = out[c][m];
      TESSERA_CHECK(y.defined(), "pipeline executor: {} before its forward", where("backward", m, c));
      TESSERA_CHECK(last || outGrad[c][m].defined(), "pipeline executor: {} has no output gradient",
                    where("backward", m, c));
      if (!last) arrived(gradWork[c][m]);
      const bool lastOne = tick == lastBackward;
      if (opts_.beforeBackward) opts_.beforeBackward(m, c, lastOne);
      if (y.requires_grad()) {
        try {
          std::optional<nn::DeferWeightGrads> defer;
          if (split) defer.emplace(deferred[c][m]);
          // `y` may hold no data any more (freed after its send): its graph is what counts.
          torch::autograd::backward({y}, last ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{outGrad[c][m]});
        } catch (const std::exception& e) {
          throw Error(fmt::format("pipeline executor: {} failed: {}", where("backward", m, c), e.what()));
        }
      }
      if (opts_.afterBackward) opts_.afterBackward(m, c, lastOne);
      if (!first) {
        auto g = in[c][m].grad();
        inGrad[c][m] = g.defined() ? g : at::zeros_like(in[c][m]);
      }
      held -= bytesOf(y);
      y = at::Tensor();
      in[c][m] = outGrad[c][m] = at::Tensor();
      if (!split) --inFlight;
    } else if (a.kind == Action::WeightGrad) {
      try {
        deferred[c][m].run();
      } catch (const std::exception& e) {
        throw Error(fmt::format("pipeline executor: {} failed: {}", where("weight gradient", m, c), e.what()));
      }
      --inFlight;
    } else {
      std::vector<Transfer> ops;
      for (const auto& t : a.comm) {
        const int tm = t.micro, tc = t.chunk;
        switch (t.kind) {
          case CommKind::SendForward: ops.push_back({t.kind, outMeta_[tc], out[tc][tm], where("activation", tm, tc)}); break;
          case CommKind::RecvForward: ops.push_back({t.kind, inMeta_[tc], {}, where("activation", tm, tc)}); break;
          case CommKind::SendBackward: ops.push_back({t.kind, inMeta_[tc], inGrad[tc][tm], where("input gradient", tm, tc)}); break;
          case CommKind::RecvBackward: ops.push_back({t.kind, outMeta_[tc], {}, where("output gradient", tm, tc)}); break;
        }
      }
      auto posted = p2p_->post(ops);
      const auto& got = posted.received;
      bool sent = false;
      for (size_t i = 0; i < a.comm.size(); ++i) {
        const auto& t = a.comm[i];
        const int tm = t.micro, tc = t.chunk;
        sent = sent || isSend(t.kind);
        if (t.kind == CommKind::RecvForward) in[tc][tm] = got[i], inWork[tc][tm] = posted.work;
        if (t.kind == CommKind::RecvBackward) outGrad[tc][tm] = got[i], gradWork[tc][tm] = posted.work;
        if (t.kind == CommKind::SendBackward) inGrad[tc][tm] = at::Tensor();
        if (t.kind == CommKind::SendForward && opts_.freeSentOutputs) {
          auto& y = out[tc][tm];
          // Megatron's deallocate_output_tensor: keep the tensor (and its grad_fn), drop its
          // data. Not when the output is the stage's input itself (an identity stage).
          if (y.defined() && !y.is_same(in[tc][tm]) && y.grad_fn()) {
            held -= bytesOf(y);
            y.set_data(at::empty({0}, at::TensorOptions().dtype(y.scalar_type()).device(y.device())));
            ++stats_.freedOutputs;
          }
        }
      }
      if (sent) sends.push_back(posted.work);
    }
  }
  for (auto& w : sends) arrived(w);
  TESSERA_CHECK(inFlight == 0, "pipeline executor: {} (micro, chunk) pairs left without backward on pp rank {}",
                inFlight, r);
}

}  // namespace tessera::pipeline
