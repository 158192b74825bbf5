// One step's walk of this rank's schedule table (PipelineExecutor::run; contract in executor.h):
// forwards, backwards (split into B and W for zero-bubble tables) and the transfers between them.
#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "tessera/common/error.h"
#include "tessera/nn/deferred_grads.h"
#include "tessera/parallel/pipeline/executor.h"

namespace tessera::pipeline {

namespace {
int64_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}
using Grid = std::vector<std::vector<at::Tensor>>;
}  // namespace

// The step's state per (chunk, micro): the stage input (a received leaf, or the micro-batch), the
// output kept for backward (the scaled loss on the last stage), the received output gradient, the
// input gradient to send. The batch each received input / output gradient arrives with is waited on
// (on CUDA, a stream wait) just before the computation that uses it, so a rank computes whatever it
// already has while its neighbours still work on what it receives next. Sends are waited on at the
// end of the step only (their errors surface there at the latest).
struct PipelineExecutor::Run {
  PipelineExecutor& e;
  const std::vector<at::Tensor>& inputs;
  const std::vector<at::Tensor>& targets;
  at::Tensor& lossSum;
  const int r, M, V;
  const bool split;  // a split backward (ZB-H1): the weight-gradient work B deferred, run by W
  Grid in, out, outGrad, inGrad;
  std::vector<std::vector<WorkPtr>> inWork, gradWork;
  std::vector<WorkPtr> sends;
  std::vector<std::vector<nn::WeightGradQueue>> deferred;
  int inFlight = 0;
  int64_t held = 0;

  Run(PipelineExecutor& ex, const std::vector<at::Tensor>& in_, const std::vector<at::Tensor>& t, at::Tensor& loss)
      : e(ex), inputs(in_), targets(t), lossSum(loss), r(ex.rank()), M(ex.sched_.numMicro), V(ex.sched_.chunks),
        split(ex.sched_.splitsBackward()), in(grid()), out(grid()), outGrad(grid()), inGrad(grid()),
        inWork(V, std::vector<WorkPtr>(M)), gradWork(V, std::vector<WorkPtr>(M)),
        deferred(V, std::vector<nn::WeightGradQueue>(M)) {}

  Grid grid() const { return Grid(V, std::vector<at::Tensor>(M)); }
  static void arrived(WorkPtr& w) {
    if (w) w->wait();
    w.reset();
  }
  std::string where(const char* what, int m, int c) const {
    return fmt::format("{} of micro-batch {} on stage {} (pp rank {}, chunk {})", what, m, e.sched_.stageOf(r, c), r, c);
  }

  void forward(int m, int c) {
    const bool first = e.sched_.isFirstStage(r, c), last = e.sched_.isLastStage(r, c);
    const int local = e.sched_.localPrevChunk(r, c);  // ZB-V's turn: the input is this rank's output
    if (!first && local < 0) arrived(inWork[c][m]);
    if (local >= 0) {
      TESSERA_CHECK(out[local][m].defined(), "pipeline executor: {} before the forward of chunk {}",
                    where("forward", m, c), local);
      in[c][m] = out[local][m].detach();
    }
    at::Tensor x = first ? inputs.at(m) : in[c][m];
    TESSERA_CHECK(x.defined(), "pipeline executor: {} has no input", where("forward", m, c));
    if (!first) x.requires_grad_(true);
    in[c][m] = x;
    at::Tensor y;
    try {
      y = e.chunks_[c](x);
      if (last) y = e.loss_(y, targets.at(m)) / static_cast<double>(M);
    } catch (const std::exception& ex) {
      throw Error(fmt::format("pipeline executor: {} failed: {}", where("forward", m, c), ex.what()));
    }
    if (last) lossSum.add_(y.detach().to(at::kFloat).reshape({1}));
    out[c][m] = y;
    held += bytesOf(y);
    e.stats_.peakOutputBytes = std::max(e.stats_.peakOutputBytes, held);
    e.stats_.peakInFlight = std::max(e.stats_.peakInFlight, ++inFlight);
  }

  void backward(int m, int c, bool lastOne) {
    const bool first = e.sched_.isFirstStage(r, c), last = e.sched_.isLastStage(r, c);
    auto& y = out[c][m];
    TESSERA_CHECK(y.defined(), "pipeline executor: {} before its forward", where("backward", m, c));
    TESSERA_CHECK(last || outGrad[c][m].defined(), "pipeline executor: {} has no output gradient",
                  where("backward", m, c));
    if (!last) arrived(gradWork[c][m]);
    if (e.opts_.beforeBackward) e.opts_.beforeBackward(m, c, lastOne);
    if (y.requires_grad()) {
      try {
        std::optional<nn::DeferWeightGrads> defer;
        if (split) defer.emplace(deferred[c][m]);
        // `y` may hold no data any more (freed after its send): its graph is what counts.
        torch::autograd::backward({y}, last ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{outGrad[c][m]});
      } catch (const std::exception& ex) {
        throw Error(fmt::format("pipeline executor: {} failed: {}", where("backward", m, c), ex.what()));
      }
    }
    if (e.opts_.afterBackward) e.opts_.afterBackward(m, c, lastOne);
    if (!first) {
      auto g = in[c][m].grad();
      inGrad[c][m] = g.defined() ? g : at::zeros_like(in[c][m]);
      if (const int local = e.sched_.localPrevChunk(r, c); local >= 0) {
        outGrad[local][m] = inGrad[c][m];  // ZB-V's turn: the gradient stays on this rank
        inGrad[c][m] = at::Tensor();
      }
    }
    held -= bytesOf(y);
    y = at::Tensor();
    in[c][m] = outGrad[c][m] = at::Tensor();
    if (!split) --inFlight;
  }

  void weightGrad(int m, int c) {
    try {
      deferred[c][m].run();
    } catch (const std::exception& ex) {
      throw Error(fmt::format("pipeline executor: {} failed: {}", where("weight gradient", m, c), ex.what()));
    }
    --inFlight;
  }

  // Megatron's deallocate_output_tensor: keep the sent output (and its grad_fn), drop its data. Not
  // when the output is the stage's input itself (an identity stage).
  void freeSent(int m, int c) {
    auto& y = out[c][m];
    if (y.defined() && !y.is_same(in[c][m]) && y.grad_fn()) {
      held -= bytesOf(y);
      y.set_data(at::empty({0}, at::TensorOptions().dtype(y.scalar_type()).device(y.device())));
      ++e.stats_.freedOutputs;
    }
  }

  void communicate(const Action& a) {
    std::vector<Transfer> ops;
    for (const auto& t : a.comm) {
      const int tm = t.micro, tc = t.chunk;
      switch (t.kind) {
        case CommKind::SendForward: ops.push_back({t.kind, e.outMeta_[tc], out[tc][tm], where("activation", tm, tc), t.peer}); break;
        case CommKind::RecvForward: ops.push_back({t.kind, e.inMeta_[tc], {}, where("activation", tm, tc), t.peer}); break;
        case CommKind::SendBackward: ops.push_back({t.kind, e.inMeta_[tc], inGrad[tc][tm], where("input gradient", tm, tc), t.peer}); break;
        case CommKind::RecvBackward: ops.push_back({t.kind, e.outMeta_[tc], {}, where("output gradient", tm, tc), t.peer}); break;
      }
    }
    auto posted = e.p2p_->post(ops);
    const auto& got = posted.received;
    bool sent = false;
    for (size_t i = 0; i < a.comm.size(); ++i) {
      const auto& t = a.comm[i];
      const int tm = t.micro, tc = t.chunk;
      sent = sent || isSend(t.kind);
      if (t.kind == CommKind::RecvForward) in[tc][tm] = got[i], inWork[tc][tm] = posted.work;
      if (t.kind == CommKind::RecvBackward) outGrad[tc][tm] = got[i], gradWork[tc][tm] = posted.work;
      if (t.kind == CommKind::SendBackward) inGrad[tc][tm] = at::Tensor();
      if (t.kind == CommKind::SendForward && e.opts_.freeSentOutputs) freeSent(tm, tc);
    }
    if (sent) sends.push_back(posted.work);
  }

  void walk() {
    const auto& table = e.sched_.ranks.at(r);
    size_t lastBackward = table.size();
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].kind == Action::Backward) lastBackward = i;
    }
    for (size_t tick = 0; tick < table.size(); ++tick) {
      const auto& a = table[tick];
      switch (a.kind) {
        case Action::Forward: forward(a.micro, a.chunk); break;
        case Action::Backward: backward(a.micro, a.chunk, tick == lastBackward); break;
        case Action::WeightGrad: weightGrad(a.micro, a.chunk); break;
        case Action::Comm: communicate(a); break;
      }
    }
    for (auto& w : sends) arrived(w);
    TESSERA_CHECK(inFlight == 0, "pipeline executor: {} (micro, chunk) pairs left without backward on pp rank {}",
                  inFlight, r);
  }
};

void PipelineExecutor::run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                           at::Tensor& lossSum) {
  Run(*this, inputs, targets, lossSum).walk();
}

}  // namespace tessera::pipeline
