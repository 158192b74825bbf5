// PipelineExecutor's agreement before any activation moves (executor.h): the preamble (every pp
// rank's schedule, the input's shape, the batch sizes, checked alike on every rank) and the shape
// probe that learns the stages' activation shapes.
#include <ATen/core/grad_mode.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <optional>

#include "tessera/common/autocast.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"
#include "tessera/parallel/pipeline/executor.h"

namespace tessera::pipeline {

namespace {
// Preamble layout (int64, summed over the pp group; each slot has one contributor):
// [0] input batch (pp rank 0; -1: no input)   [1] target batch (last pp rank; -1: no target,
// -2: no loss function)   [2] input dtype   [3] input ndim   [4, 4 + kMaxHeaderDims) dims
// then per pp rank r: [kCfg + kPer·r + 0..3] = schedule kind + 1, micro-batches, chunks, extra
// warm-up forwards.
constexpr int kDims = 4, kCfg = kDims + kMaxHeaderDims, kPer = 4;

std::vector<int64_t> toVector(const at::Tensor& t) {
  auto c = t.cpu().contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}
}  // namespace

std::vector<int64_t> PipelineExecutor::preamble(const at::Tensor& input, const at::Tensor& target) {
  const int P = sched_.pp, r = rank(), M = sched_.numMicro;
  auto cpu = at::zeros({kCfg + kPer * P}, at::kLong);
  auto* v = cpu.data_ptr<int64_t>();
  if (r == 0) {
    v[0] = input.defined() && input.dim() > 0 ? input.size(0) : -1;
    if (input.defined()) {
      v[2] = static_cast<int64_t>(input.scalar_type());
      v[3] = input.dim();
      for (int64_t d = 0; d < std::min<int64_t>(input.dim(), kMaxHeaderDims); ++d) v[kDims + d] = input.size(d);
    }
  }
  if (r == sched_.lastStageRank()) v[1] = !loss_ ? -2 : target.defined() && target.dim() > 0 ? target.size(0) : -1;
  v[kCfg + kPer * r] = static_cast<int64_t>(sched_.kind) + 1;
  v[kCfg + kPer * r + 1] = M;
  v[kCfg + kPer * r + 2] = sched_.chunks;
  v[kCfg + kPer * r + 3] = sched_.extraWarmup;
  std::vector<int64_t> g;
  if (P == 1) {
    g.assign(v, v + cpu.numel());  // nothing to agree on: no round trip through the device
  } else {
    // On a side stream: the read-back waits for the pp group's transfers queued before it, not
    // for this rank's compute stream (the previous step's optimizer may still run there).
    std::optional<c10::StreamGuard> side;
    if (opts_.device.is_cuda()) {
      c10::impl::VirtualGuardImpl impl(opts_.device.type());
      if (!preambleStream_) preambleStream_ = impl.getStreamFromGlobalPool(opts_.device, /*isHighPriority=*/true);
      side.emplace(*preambleStream_);
    }
    SyncCheck expected(opts_.device, SyncDebug::Off);  // the step's one host round trip (header)
    auto t = cpu.to(opts_.device);
    group_->allReduce(t, ReduceOp::Sum)->wait();
    g = toVector(t);
  }

  // Every rank runs the same checks on the same numbers: the same error everywhere.
  for (int q = 1; q < P; ++q)
    for (int k = 0; k < kPer; ++k)
      TESSERA_CHECK(g[kCfg + kPer * q + k] == g[kCfg + k],
                    "pipeline step: the pp ranks disagree on the schedule: pp rank 0 runs kind {} with {} "
                    "micro-batches x {} chunks and {} extra warm-up forwards, pp rank {} kind {} with {} x {} and {}",
                    g[kCfg] - 1, g[kCfg + 1], g[kCfg + 2], g[kCfg + 3], q, g[kCfg + kPer * q] - 1,
                    g[kCfg + kPer * q + 1], g[kCfg + kPer * q + 2], g[kCfg + kPer * q + 3]);
  const int64_t B = g[0], T = g[1];
  TESSERA_CHECK(B >= 0, "pipeline step: pp rank 0 (the first stage) was given no input batch (an undefined or 0-dim tensor)");
  TESSERA_CHECK(T != -2, "pipeline step: pp rank {} (the last stage) has no loss function", sched_.lastStageRank());
  TESSERA_CHECK(T >= 0, "pipeline step: pp rank {} (the last stage) was given no target batch", sched_.lastStageRank());
  TESSERA_CHECK(g[3] <= kMaxHeaderDims, "pipeline step: the input has {} dims; at most {} are supported", g[3], kMaxHeaderDims);
  TESSERA_CHECK(B % M == 0 && B > 0,
                "pipeline step: a batch of {} samples is not divisible into {} micro-batches ({} schedule, pp = {})", B,
                M, toString(sched_.kind), P);
  TESSERA_CHECK(T == B, "pipeline step: the input batch has {} samples but the target batch {}", B, T);

  return std::vector<int64_t>(g.begin() + 2, g.begin() + kCfg);
}

void PipelineExecutor::probe(const at::Tensor& input0, const at::Tensor& target0) {
  const int r = rank();
  int64_t failed = 0;
  std::string why;
  TensorMeta failedIn;
  // The probe's weight casts must not serve the step's forward (common/autocast.h): a tied table's
  // cast made here ran last in step 1's backward, and DDP built its buckets from that order.
  NoAutocastCache freshCasts;
  for (int c = 0; c < sched_.chunks; ++c) {
    const int s = sched_.stageOf(r, c);
    const bool first = s == 0, last = s == sched_.numStages() - 1;
    at::Tensor x;
    const int local = sched_.localPrevChunk(r, c);  // ZB-V's turn: chunk `local`'s output, on this rank
    if (first) {
      x = input0;
    } else {
      Header h = local >= 0 ? Header{failed, outMeta_[local]} : p2p_->recvHeader(sched_.rankOfStage(s - 1));
      failed = h.status;
      inMeta_[c] = h.meta;
      if (!failed) x = at::zeros(h.meta.shape, at::TensorOptions().dtype(h.meta.dtype).device(opts_.device));
    }
    TensorMeta out;
    if (!failed) {
      try {
        at::NoGradGuard ng;
        auto y = chunks_[c](x);
        TESSERA_CHECK(y.defined(), "the stage returned an undefined tensor");
        if (last) {
          auto l = loss_(y, target0);
          TESSERA_CHECK(l.defined() && l.numel() == 1, "the loss function must return one value, returned {}",
                        l.defined() ? TensorMeta::of(l).str() : "undefined");
        }
        out = TensorMeta::of(y);
      } catch (const std::exception& e) {
        failed = s + 1;
        why = e.what();
        failedIn = TensorMeta::of(x);
      }
    }
    if (!last && sched_.localNextChunk(r, c) < 0) p2p_->sendHeader({failed, out}, sched_.rankOfStage(s + 1));
    outMeta_[c] = out;
  }
  // Only the first failing stage contributes; everyone learns which it was.
  auto cpu = at::zeros({2 + kMaxHeaderDims + 1}, at::kLong);
  if (!why.empty()) {
    auto* v = cpu.data_ptr<int64_t>();
    v[0] = failed;
    v[1] = static_cast<int64_t>(failedIn.dtype);
    v[2] = static_cast<int64_t>(failedIn.shape.size());
    for (size_t i = 0; i < failedIn.shape.size() && i < static_cast<size_t>(kMaxHeaderDims); ++i) v[3 + i] = failedIn.shape[i];
  }
  auto t = cpu.to(opts_.device);
  group_->allReduce(t, ReduceOp::Sum)->wait();
  auto g = toVector(t);
  if (g[0] == 0) return;
  const int s = static_cast<int>(g[0] - 1), owner = sched_.rankOfStage(s), chunk = sched_.chunkOfStage(s);
  TensorMeta in{std::vector<int64_t>(g.begin() + 3, g.begin() + 3 + g[2]), static_cast<at::ScalarType>(g[1])};
  std::string from = s == 0 ? "the batch" : fmt::format("stage {}", s - 1);
  if (!why.empty())
    throw Error(fmt::format("pipeline stage {} (pp rank {}, chunk {}) failed on its input {} from {}: {}", s, owner, chunk,
                            in.str(), from, why));
  throw Error(fmt::format("pipeline step aborted on every pp rank: stage {} (pp rank {}, chunk {}) failed on its input "
                          "{} from {}; pp rank {} reports the cause",
                          s, owner, chunk, in.str(), from, owner));
}

}  // namespace tessera::pipeline
