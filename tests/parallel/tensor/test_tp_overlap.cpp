// The overlapped backward of ColumnParallelLinear (linear_overlap.h), TP = 2 and 4, with and
// without sequence parallel, on Gloo:
// - it is the path taken, in the promised order: a recording communicator (wrapping the
//   world communicator) logs each launch and each wait, the layer's backward trace logs its
//   GEMMs; the input-gradient collective must be launched after the grad-input GEMM, before
//   the weight GEMM, and waited after it. Rank 1 sleeps before launching its collective, so on
//   rank 0 the collective is provably still in flight while the weight GEMM is issued.
// - with overlapGradReduce off the same layer gives the same output and gradients, and so
//   does the unsharded torch::nn::Linear (rtol 1e-5, atol 1e-6, as test_tp_linear: fp32, the
//   only differences are the order of partial sums).
// - an input that needs no gradient: no input-gradient collective at all.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "harness/multiprocess.h"
#include "recording_comm.h"
#include "tessera/parallel/tensor/linear.h"

using namespace tessera;
using namespace tessera::testing;

namespace {
constexpr int64_t IN = 8, OUT = 16, S = 8, B = 3;

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: missing or shape mismatch", what);
  WCHECK(at::allclose(got, want, 1e-5, 1e-6), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}
at::Tensor shard(const at::Tensor& t, int64_t dim, const CommPtr& tp) { return t.chunk(tp->size(), dim)[tp->rank()]; }
}  // namespace

TESSERA_WORKER(tp_overlap) {
  auto ctx = initWorker(w);
  const bool sp = w.arg == "sp";
  EventLog log;
  auto rec = std::make_shared<RecordingComm>(ctx.world, &log);
  const CommPtr tp = rec;

  tp::ParallelLinearOptions on, off;
  on.name = off.name = "qkv";
  on.sequenceParallel = off.sequenceParallel = sp;
  off.overlapGradReduce = false;
  on.backwardTrace = [&](const char* e) {
    std::string ev = e;
    if (ev == "grad_input" && tp->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // On rank 0 the collective launched before this GEMM cannot have finished: rank 1 is late.
    if (ev == "grad_weight" && rec->last()) ev += rec->last()->completed() ? "(collective done)" : "(in flight)";
    log.add(ev);
  };
  torch::manual_seed(3);
  torch::nn::Linear ref(IN, OUT);
  torch::manual_seed(3);
  tp::ColumnParallelLinear a(tp, IN, OUT, on);
  torch::manual_seed(3);
  tp::ColumnParallelLinear b(tp, IN, OUT, off);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  auto xFull = at::randn({S, B, IN}, gen), gFull = at::randn({S, B, OUT}, gen);
  auto xRef = xFull.clone().requires_grad_();
  (ref->forward(xRef) * gFull).sum().backward();
  auto xLocal = sp ? shard(xFull, 0, tp) : xFull;
  auto g = shard(gFull, -1, tp);

  auto xa = xLocal.clone().requires_grad_(), xb = xLocal.clone().requires_grad_();
  auto ya = a->forward(xa);
  log.take();  // forward's own gather (sequence parallel)
  (ya * g).sum().backward();
  auto events = log.take();
  auto yb = b->forward(xb);
  (yb * g).sum().backward();
  auto offEvents = log.take();

  std::vector<std::string> want =
      sp ? std::vector<std::string>{"launch:all_gather", "grad_input", "launch:reduce_scatter", "wait:all_gather",
                                    "grad_weight", "wait:reduce_scatter"}
         : std::vector<std::string>{"grad_input", "launch:all_reduce", "grad_weight", "wait:all_reduce"};
  auto gw = std::find_if(events.begin(), events.end(), [](auto& e) { return e.rfind("grad_weight", 0) == 0; });
  WCHECK(gw != events.end(), "overlap path not taken: events [{}]", fmt::join(events, ", "));
  if (tp->rank() == 0) WCHECK(*gw == "grad_weight(in flight)", "rank 0: {}", *gw);
  *gw = "grad_weight";
  WCHECK(events == want, "overlapped backward events [{}], expected [{}]", fmt::join(events, ", "), fmt::join(want, ", "));
  // The plain path (forward's gather included): the collective comes from the mapping, after
  // the layer's own backward, and is waited at once.
  std::vector<std::string> wantOff = sp ? std::vector<std::string>{"launch:all_gather", "wait:all_gather",
                                                                  "launch:reduce_scatter", "wait:reduce_scatter"}
                                        : std::vector<std::string>{"launch:all_reduce", "wait:all_reduce"};
  WCHECK(offEvents == wantOff, "plain backward events [{}]", fmt::join(offEvents, ", "));

  expectClose(ya, yb, "output (overlap vs plain)");
  expectClose(xa.grad(), xb.grad(), "input grad (overlap vs plain)");
  expectClose(a->weight.grad(), b->weight.grad(), "weight grad (overlap vs plain)");
  expectClose(a->bias.grad(), b->bias.grad(), "bias grad (overlap vs plain)");
  expectClose(xa.grad(), sp ? shard(xRef.grad(), 0, tp) : xRef.grad(), "input grad (vs unsharded)");
  expectClose(a->weight.grad(), shard(ref->weight.grad(), 0, tp), "weight grad (vs unsharded)");
  expectClose(a->bias.grad(), shard(ref->bias.grad(), 0, tp), "bias grad (vs unsharded)");

  // An input without gradient: only the weight gradients (and, with sp, the re-gather).
  a->zero_grad();
  auto yc = a->forward(xLocal);
  log.take();
  (yc * g).sum().backward();
  auto noX = log.take();
  for (auto& e : noX) WCHECK(e.find("all_reduce") == std::string::npos && e.find("reduce_scatter") == std::string::npos,
                             "no input gradient wanted, yet [{}]", fmt::join(noX, ", "));
  expectClose(a->weight.grad(), shard(ref->weight.grad(), 0, tp), "weight grad, input without grad");
}

struct OverlapCase {
  int ranks;
  const char* mode;
};
void PrintTo(const OverlapCase& c, std::ostream* os) { *os << "tp" << c.ranks << " " << c.mode; }

class TpOverlap : public ::testing::TestWithParam<OverlapCase> {};

TEST_P(TpOverlap, CollectiveRunsDuringWeightGemmAndGradientsMatch) {
  auto c = GetParam();
  expectAllOk(runWorkers("tp_overlap", {.ranks = c.ranks, .arg = c.mode}));
}

INSTANTIATE_TEST_SUITE_P(Cases, TpOverlap,
                         ::testing::Values(OverlapCase{2, "plain"}, OverlapCase{4, "plain"}, OverlapCase{2, "sp"},
                                           OverlapCase{4, "sp"}));
