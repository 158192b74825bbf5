// Pipeline execution on Gloo (pp = 2 and 4 processes) against the unsplit model.
//
// Model: Linear(4→8) embedding, 8 residual blocks x + Linear(tanh(Linear(x))) (d 8),
// Linear(8→2) head, mean squared error; every rank builds the whole model from the same
// seed, computes the reference (whole batch, one backward) and then runs its own stages
// through the pipeline. For GPipe, 1F1B (also with 2 extra warm-up forwards) and interleaved
// 1F1B (2 chunks) with 1 to 8 micro-batches (where the schedule allows), 1F1B on an explicit
// unbalanced split, and at pp 2 interleaved with 3 chunks (6 stages), three steps each (batch
// 3·M: probes the shapes; 3·M again: cached shapes; 6·M: shapes change, probes again): the
// loss on every rank and every parameter gradient of this rank's stages equal the reference's.
// Tolerance: fp32, rtol 1e-5, atol 1e-7. The pipeline computes the same products on
// micro-batches: the GEMMs' reduction over the batch is split into per-micro-batch sums
// accumulated in autograd, and each micro-batch loss is scaled by 1/M before backward, so
// only the summation order and the place of one scaling differ (a few ulps on gradients of
// order 1e-2..1).
// The same for tests/models' TinyGpt (8 pre-LN blocks, d 16, tokens [8, 8] → logits, mean
// cross-entropy): int64 tokens into stage 0, [mb, 8, 16] activations between stages, for
// GPipe, 1F1B and interleaved 1F1B at pp 2 and 4; same tolerance (LayerNorm and softmax are
// per sample, so again only the batch reductions of the weight gradients are reordered).
// The TinyGpt cases also run on 2 GPUs over NCCL (test_pipeline_gpu, TESSERA_PP_GPU_SUITE:
// CUDA tensors, stream-ordered waits on the receives; rtol 1e-4, atol 1e-6 there, as cuBLAS and
// the attention kernels may pick other reduction orders for the micro-batch shapes).
// Memory, measured through weak references to storages (MemoryProbe), not the executor's
// tallies: a micro-batch's activations (what its blocks saved for backward, its received
// input) live from its forward to its backward, so at most as many micro-batches at once as
// the table has in flight (pp − rank (+ extra warm-up) for 1F1B, all M on GPipe's first
// stage); and a sent output's storage is freed once its send has completed (both models'
// stages end in a residual add, which saves nothing for backward, so only the executor's
// freeing can free it; checked on Gloo only).
// Errors: indivisible batch, too few micro-batches, mismatched shapes between stages,
// input/target disagreement thrown on every rank, the communicator still usable afterwards;
// a stage output that changes shape or dtype on a later step fails on its rank naming both
// shapes, and its peers end with an error, by its exit or by the communicator's timeout.
#include <gtest/gtest.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <thread>

#include "comm/gpu/gpu_test_util.h"
#include "harness/multiprocess.h"
#include "models/tiny_models.h"
#include "tessera/nn/accum_linear.h"
#include "tessera/parallel/pipeline/executor.h"
#include "tessera/parallel/pipeline/partition.h"

using namespace tessera;
using namespace tessera::pipeline;
using namespace tessera::testing;

namespace {
constexpr int64_t IN = 4, D = 8, OUT = 2, BLOCKS = 8;

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;
WeakStorage weakStorage(const at::Tensor& t) { return t.storage().getWeakStorageImpl(); }

// Where ResBlock reports the activation it saves for backward (set by MemoryProbe while a
// stage's forward runs with gradients; null otherwise).
std::vector<WeakStorage>* g_savedSink = nullptr;

// x + fc2(tanh(fc1(x))): tanh and fc2 save h for backward; the block's output is saved by
// nothing (the add saves no operand), so a stage ending in this block really frees its
// output when the executor drops it after the send. The linears sum their weight gradients in
// the GEMM (nn/accum_linear.h), as the models' do: under ZB-H1 that work waits for W, holding
// h until then.
struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, d))), fc2(register_module("fc2", torch::nn::Linear(d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(nn::linearAccumulateGrad(x, fc1->weight, fc1->bias));
    if (g_savedSink) g_savedSink->push_back(weakStorage(h));
    return x + nn::linearAccumulateGrad(h, fc2->weight, fc2->bias);
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ResBlock);

// What the executor really keeps alive on this rank, seen through weak references to
// storages (an expired one has been freed): per (chunk, micro-batch) of the step, the
// activations its ResBlocks saved for backward and the input received from the previous
// stage (held by the executor for its gradient; stage 0's input is a view of the batch, not
// counted), and the output the stage returned.
// Wrap each chunk's function with wrap() and pass hook() the executor's options; call
// newStep() before every step, then read peakLive and error.
struct MemoryProbe {
  std::vector<std::vector<std::vector<WeakStorage>>> saved;  // [chunk][micro]
  std::vector<std::vector<WeakStorage>> outputs;            // [chunk][micro]
  std::vector<bool> sends, receives;                        // [chunk]: its output is sent, its input received
  int peakLive = 0;    // most (chunk, micro) pairs with an activation alive, seen at a forward
  std::string error;   // the first output found alive after its send completed

  MemoryProbe(const Schedule& s, int rank) : saved(s.chunks), outputs(s.chunks), sends(s.chunks), receives(s.chunks) {
    for (int c = 0; c < s.chunks; ++c) sends[c] = !s.isLastStage(rank, c), receives[c] = !s.isFirstStage(rank, c);
  }
  void newStep() {
    for (auto& v : saved) v.clear();
    for (auto& v : outputs) v.clear();
    peakLive = 0;
    error.clear();
  }
  int live() const {
    int n = 0;
    for (const auto& chunk : saved)
      for (const auto& mb : chunk)
        n += std::any_of(mb.begin(), mb.end(), [](const WeakStorage& w) { return !w.expired(); });
    return n;
  }
  // Forwards run in micro-batch order on every chunk, so the k-th forward of chunk c (with
  // gradients: the shape probe runs without) is micro-batch k.
  PipelineExecutor::ChunkFn wrap(int c, PipelineExecutor::ChunkFn f) {
    return [this, c, f = std::move(f)](const at::Tensor& x) {
      if (!at::GradMode::is_enabled()) return f(x);
      std::vector<WeakStorage> mine;
      if (receives[c]) mine.push_back(weakStorage(x));
      g_savedSink = &mine;
      at::Tensor y;
      try {
        y = f(x);
      } catch (...) {
        g_savedSink = nullptr;
        throw;
      }
      g_savedSink = nullptr;
      saved[c].push_back(std::move(mine));
      outputs[c].push_back(weakStorage(y));
      peakLive = std::max(peakLive, live());
      return y;
    };
  }
  // Before the backward of (m, c) the gradient of output m has arrived, so its send (and
  // every earlier one of that chunk, the communicator runs them in order) has completed:
  // with the executor's freeing, nothing holds those outputs' storages any more.
  void beforeBackward(int m, int c) {
    if (!sends[c] || !error.empty()) return;
    for (int k = 0; k <= m && k < static_cast<int>(outputs[c].size()); ++k)
      if (!outputs[c][k].expired())
        error = fmt::format("the output of micro-batch {} (chunk {}) is still alive at the backward of micro-batch {}",
                            k, c, m);
  }
  void hook(ExecutorOptions& o) {
    o.beforeBackward = [this](int m, int c, bool) { beforeBackward(m, c); };
  }
};

SequentialModel makeModel(uint64_t seed) {
  torch::manual_seed(seed);
  SequentialModel m;
  m.embedding = torch::nn::AnyModule(torch::nn::Linear(IN, D));
  for (int i = 0; i < BLOCKS; ++i) m.blocks.emplace_back(ResBlock(D));
  m.head = torch::nn::AnyModule(torch::nn::Linear(D, OUT));
  return m;
}

std::vector<at::Tensor> allParams(const SequentialModel& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.embedding.ptr()->parameters()) out.push_back(p);
  for (auto& b : m.blocks) for (auto& p : b.ptr()->parameters()) out.push_back(p);
  for (auto& p : m.head.ptr()->parameters()) out.push_back(p);
  return out;
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) { return (out - y).pow(2).mean(); }

at::Tensor randnSeeded(std::vector<int64_t> shape, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g);
}

void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what, double rtol = 1e-5,
                 double atol = 1e-7) {
  WCHECK(got.defined() && got.sizes() == want.sizes(), "{}: missing or wrong shape", what);
  WCHECK(at::allclose(got, want, rtol, atol), "{}: max |diff| = {}", what, (got - want).abs().max().item<double>());
}

struct Case {
  ScheduleKind kind;
  int micro, chunks;
  int extra = 0;            // 1F1B's extra warm-up forwards
  std::vector<int> layers;  // explicit blocks per stage (empty: balanced)
};

std::string describe(const Case& c) {
  return fmt::format("{} M={} chunks={} extra warm-up={}{}", toString(c.kind), c.micro, c.chunks, c.extra,
                     c.layers.empty() ? "" : fmt::format(" layers [{}]", fmt::join(c.layers, ", ")));
}

std::vector<Case> casesFor(int P) {
  std::vector<Case> out;
  for (int M = 1; M <= 8; ++M) {
    out.push_back({ScheduleKind::GPipe, M, 1});
    if (M >= P) out.push_back({ScheduleKind::OneFOneB, M, 1});
    if (M >= P && M >= 3) out.push_back({ScheduleKind::OneFOneB, M, 1, 2});
    if (M >= P) out.push_back({ScheduleKind::ZeroBubbleH1, M, 1});
    if (M % P == 0) out.push_back({ScheduleKind::Interleaved1F1B, M, 2});
  }
  // An explicit, unbalanced split of the 8 blocks.
  out.push_back({ScheduleKind::OneFOneB, 5, 1, 0, P == 2 ? std::vector<int>{1, 7} : std::vector<int>{3, 1, 1, 3}});
  // Three chunks per rank: 6 stages of 1-2 blocks (8 blocks cannot feed 12 stages at pp = 4).
  if (P == 2) {
    out.push_back({ScheduleKind::Interleaved1F1B, 4, 3});
    out.push_back({ScheduleKind::Interleaved1F1B, 6, 3});
  }
  return out;
}

std::unique_ptr<PipelineExecutor> makeExecutor(const CommPtr& g, const SequentialModel& m, const Case& c,
                                               std::vector<at::Tensor>* params = nullptr,
                                               MemoryProbe* probe = nullptr) {
  const int P = g->size(), r = g->rank();
  auto part = partitionModel(m, {.pp = P, .chunks = c.chunks, .layersPerStage = c.layers});
  auto sched = makeSchedule(c.kind, P, c.micro, c.chunks, c.extra);
  std::vector<PipelineExecutor::ChunkFn> fns;
  for (int k = 0; k < c.chunks; ++k) {
    auto st = buildStage(m, part, part.stageOf(r, k));
    fns.push_back(probe ? probe->wrap(k, st.forward) : st.forward);
    if (params) params->insert(params->end(), st.parameters.begin(), st.parameters.end());
  }
  ExecutorOptions eo;
  if (probe) probe->hook(eo);
  return std::make_unique<PipelineExecutor>(g, std::move(sched), fns, mse, eo);
}
}  // namespace

TESSERA_WORKER(pp_matches_unsplit) {
  auto ctx = initWorker(w);
  const auto& g = ctx.world;
  const int P = g->size(), r = g->rank();
  for (const auto& c : casesFor(P)) {
    const std::string name = describe(c);
    auto m = makeModel(5);
    std::vector<at::Tensor> mine;
    MemoryProbe mem(makeSchedule(c.kind, P, c.micro, c.chunks, c.extra), r);
    auto exec = makeExecutor(g, m, c, &mine, &mem);
    if (!c.layers.empty()) {
      const int stage = exec->schedule().stageOf(r, 0);
      WCHECK(mine.size() == 2 * 2 * static_cast<size_t>(c.layers[stage]) + 2 * (stage == 0) + 2 * (stage == P - 1),
             "{} rank {}: {} parameter tensors for {} blocks", name, r, mine.size(), c.layers[stage]);
    }
    for (int step = 0; step < 3; ++step) {
      const int64_t B = c.micro * (step < 2 ? 3 : 6);
      auto x = randnSeeded({B, IN}, 100 + step), y = randnSeeded({B, OUT}, 200 + step);
      // Reference: the unsplit model on the whole batch.
      auto params = allParams(m);
      for (auto& p : params) p.mutable_grad() = at::Tensor();
      auto h = m.embedding.forward(x);
      for (auto& b : m.blocks) h = b.forward(h);
      auto refLoss = mse(m.head.forward(h), y);
      refLoss.backward();
      std::map<const void*, at::Tensor> ref;
      for (auto& p : params) ref[p.unsafeGetTensorImpl()] = p.grad().clone();
      for (auto& p : params) p.mutable_grad() = at::Tensor();

      mem.newStep();
      auto loss = exec->step(r == 0 ? x : at::Tensor(), r == P - 1 ? y : at::Tensor());
      const std::string where = fmt::format("{} step {} rank {}", name, step, r);
      WCHECK(loss.dim() == 0 && loss.scalar_type() == at::kFloat, "{}: loss is not a float scalar", where);
      expectClose(loss, refLoss.detach(), where + " loss");
      WCHECK(!mine.empty(), "{}: no parameters", where);
      for (size_t i = 0; i < mine.size(); ++i)
        expectClose(mine[i].grad(), ref.at(mine[i].unsafeGetTensorImpl()), fmt::format("{} param {} grad", where, i));

      // Live activations, measured: (micro, chunk) pairs whose saved tensors or received input
      // are still alive, counted at every forward. They are the table's in-flight pairs, no
      // more (an input or a graph kept past its backward would show, as would forwards run
      // ahead of the table).
      const auto& sched = exec->schedule();
      WCHECK(mem.peakLive == sched.peakInFlight(r), "{}: {} micro-batches' activations alive at once, the table has {}",
             where, mem.peakLive, sched.peakInFlight(r));
      if (c.kind == ScheduleKind::OneFOneB)
        WCHECK(mem.peakLive <= oneFOneBBound(P, r, c.micro, c.extra), "{}: {} alive > 1F1B bound {}", where,
               mem.peakLive, oneFOneBBound(P, r, c.micro, c.extra));
      if (c.kind == ScheduleKind::ZeroBubbleH1)  // held from F to W: rank 0's 1F1B peak everywhere
        WCHECK(mem.peakLive == std::min(P, c.micro), "{}: ZB-H1 holds {} micro-batches, not min(pp, M) = {}", where,
               mem.peakLive, std::min(P, c.micro));
      if (c.kind == ScheduleKind::GPipe && r == 0)
        WCHECK(mem.peakLive == c.micro, "{}: GPipe's first stage holds {} micro-batches, not all {}", where,
               mem.peakLive, c.micro);
      // Every output this rank sends (all but the last stage's) is freed once its send has
      // completed: its storage is gone by its backward.
      WCHECK(mem.error.empty(), "{}: {}", where, mem.error);
      const auto& st = exec->lastStats();
      WCHECK(st.probed == (step != 1), "{}: probed = {}", where, st.probed);
      int sends = 0;
      for (int k = 0; k < c.chunks; ++k) sends += sched.isLastStage(r, k) ? 0 : c.micro;
      WCHECK(st.freedOutputs == sends, "{}: freed {} outputs, sent {}", where, st.freedOutputs, sends);
    }
  }
}

#ifndef TESSERA_PP_GPU_SUITE  // the Gloo suite only
TEST(Pipeline, MatchesUnsplitModelPp2) { expectAllOk(runWorkers("pp_matches_unsplit", {.ranks = 2})); }
TEST(Pipeline, MatchesUnsplitModelPp4) { expectAllOk(runWorkers("pp_matches_unsplit", {.ranks = 4})); }
#endif

namespace {
// TinyGpt as embedding → blocks → head, sharing its parameters.
struct GptEmbedImpl : torch::nn::Module {
  GptEmbedImpl(torch::nn::Embedding t, torch::Tensor p) : tok(register_module("tok", t)) { pos = register_parameter("pos", p); }
  torch::Tensor forward(const torch::Tensor& tokens) { return tok->forward(tokens) + pos.slice(0, 0, tokens.size(1)); }
  torch::nn::Embedding tok;
  torch::Tensor pos;
};
TORCH_MODULE(GptEmbed);
struct GptHeadImpl : torch::nn::Module {
  GptHeadImpl(torch::nn::LayerNorm l, torch::nn::Linear h) : lnf(register_module("lnf", l)), head(register_module("head", h)) {}
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(lnf->forward(x)); }
  torch::nn::LayerNorm lnf;
  torch::nn::Linear head;
};
TORCH_MODULE(GptHead);
}  // namespace

// arg "dev=cuda": NCCL and CUDA tensors (one GPU per rank), else Gloo on the CPU.
// Three steps per case, every parameter moved by SGD on the reference gradients between them: the
// first step probes the shapes, the later two run without a probe on updated weights.
TESSERA_WORKER(pp_gpt) {
  const bool cuda = w.arg == "dev=cuda";
  auto ctx = initWorker(w, cuda ? Backend::Nccl : Backend::Gloo);
  const auto& g = ctx.world;
  const auto dev = ctx.device;
  const double rtol = cuda ? 1e-4 : 1e-5, atol = cuda ? 1e-6 : 1e-7;
  const int P = g->size(), r = g->rank();
  TinyGptOptions o{.vocab = 32, .d = 16, .layers = 8, .heads = 2, .seqLen = 8};
  for (Case c : {Case{ScheduleKind::GPipe, 2, 1}, Case{ScheduleKind::OneFOneB, 4, 1},
                 Case{ScheduleKind::OneFOneB, 4, 1, 2}, Case{ScheduleKind::Interleaved1F1B, 4, 2},
                 Case{ScheduleKind::ZeroBubbleH1, 4, 1}}) {
    if (c.kind == ScheduleKind::Interleaved1F1B && P < 2) continue;  // needs two ranks
    auto gpt = makeTinyGpt(11, o);
    gpt->to(dev);
    SequentialModel m;
    m.embedding = torch::nn::AnyModule(GptEmbed(gpt->tok, gpt->pos));
    for (size_t i = 0; i < gpt->blocks->size(); ++i) m.blocks.emplace_back(gpt->blocks->ptr<GptBlockImpl>(i));
    m.head = torch::nn::AnyModule(GptHead(gpt->lnf, gpt->head));
    auto part = partitionModel(m, {.pp = P, .chunks = c.chunks});
    auto sched = makeSchedule(c.kind, P, c.micro, c.chunks, c.extra);
    // The blocks end in a residual add, so the executor's freeing of sent outputs is real here:
    // on Gloo, check that each one's storage is gone by its backward (on CUDA, NCCL releases a
    // sent tensor only once its stream has passed the send, which the host does not wait for).
    MemoryProbe mem(sched, r);
    std::vector<PipelineExecutor::ChunkFn> fns;
    std::vector<at::Tensor> mine;
    for (int k = 0; k < c.chunks; ++k) {
      auto st = buildStage(m, part, part.stageOf(r, k));
      fns.push_back(cuda ? st.forward : mem.wrap(k, st.forward));
      mine.insert(mine.end(), st.parameters.begin(), st.parameters.end());
    }
    ExecutorOptions eo;
    eo.device = dev;
    if (!cuda) mem.hook(eo);
    PipelineExecutor exec(g, sched, fns, gptLoss, eo);
    for (int step = 0; step < 3; ++step) {
      auto batch = gptBatch(21 + step, 0, 8, o);
      batch.tokens = batch.tokens.to(dev);
      batch.targets = batch.targets.to(dev);
      auto refLoss = gptLoss(gpt->forward(batch.tokens), batch.targets);
      refLoss.backward();
      std::map<const void*, at::Tensor> ref;
      for (auto& p : gpt->parameters()) ref[p.unsafeGetTensorImpl()] = p.grad().clone(), p.mutable_grad() = at::Tensor();
      mem.newStep();
      auto loss = exec.step(r == 0 ? batch.tokens : at::Tensor(), r == P - 1 ? batch.targets : at::Tensor());
      const std::string where =
          fmt::format("gpt {} M={} extra warm-up {} step {} rank {}", toString(c.kind), c.micro, c.extra, step, r);
      if (!cuda) {
        for (int k = 0; k < c.chunks; ++k)
          WCHECK(mem.outputs[k].size() == static_cast<size_t>(c.micro), "{}: chunk {}: {} forwards seen", where, k,
                 mem.outputs[k].size());
        WCHECK(mem.error.empty(), "{}: {}", where, mem.error);
      }
      int sends = 0;
      for (int k = 0; k < c.chunks; ++k) sends += sched.isLastStage(r, k) ? 0 : c.micro;
      WCHECK(exec.lastStats().freedOutputs == sends, "{}: freed {} outputs, sent {}", where,
             exec.lastStats().freedOutputs, sends);
      expectClose(loss, refLoss.detach(), where + " loss", rtol, atol);
      for (size_t i = 0; i < mine.size(); ++i)
        expectClose(mine[i].grad(), ref.at(mine[i].unsafeGetTensorImpl()), fmt::format("{} param {} grad", where, i),
                    rtol, atol);
      if (c.kind == ScheduleKind::OneFOneB)
        WCHECK(exec.peakInFlight() <= oneFOneBBound(P, r, c.micro, c.extra), "{}: {} in flight", where,
               exec.peakInFlight());
      at::NoGradGuard ng;
      for (auto& p : gpt->parameters()) {
        p.sub_(ref.at(p.unsafeGetTensorImpl()), 0.5);
        p.mutable_grad() = at::Tensor();
      }
    }
  }
}

#ifdef TESSERA_PP_GPU_SUITE
TEST(PipelineGpu, TinyGptMatchesUnsplitOnTwoGpus) {
  TESSERA_REQUIRE_GPUS(2);
  expectAllOk(runWorkers("pp_gpt", gpuRun(300, {}, "dev=cuda")));
}
// One stage on one GPU (pp = 1 over NCCL): the executor's CUDA path where only one GPU is lent.
TEST(PipelineGpu, TinyGptOneStageOnOneGpu) {
  TESSERA_REQUIRE_GPUS(1);
  auto o = gpuRun(300, {}, "dev=cuda");
  o.ranks = 1;
  expectAllOk(runWorkers("pp_gpt", o));
}
#else
TEST(Pipeline, TinyGptMatchesUnsplitPp2) { expectAllOk(runWorkers("pp_gpt", {.ranks = 2})); }
TEST(Pipeline, TinyGptMatchesUnsplitPp4) { expectAllOk(runWorkers("pp_gpt", {.ranks = 4})); }
#endif

// The typed P2P calls between two ranks: headers, single and fused transfers, and a tensor
// that does not match the announced shape (refused before anything is sent).
TESSERA_WORKER(pp_p2p_typed) {
  auto ctx = initWorker(w);
  StageP2P p2p(ctx.world, at::kCPU);
  const int r = p2p.rank();
  TensorMeta act{{3, 5}, at::kFloat}, grad{{3, 5}, at::kFloat};
  auto a = randnSeeded({3, 5}, 1), g = randnSeeded({3, 5}, 2), a2 = randnSeeded({3, 5}, 3);
  if (r == 0) {
    p2p.sendHeader({0, TensorMeta{{2, 7, 4}, at::kBFloat16}}, p2p.next());
    p2p.sendForward(a, act);
    WCHECK(p2p.sendForwardRecvBackward(a2, act, grad).equal(g), "fused recv-backward got the wrong gradient");
    expectErrorContaining([&] { p2p.sendForward(at::ones({3, 6}), act); },
                          {"send-fwd", "as [3, 6] float32", "announced to rank 1 is [3, 5] float32"});
  } else {
    auto h = p2p.recvHeader(p2p.prev());
    WCHECK(h.status == 0 && h.meta == (TensorMeta{{2, 7, 4}, at::kBFloat16}), "header {}", h.meta.str());
    WCHECK(p2p.recvForward(act).equal(a), "recv-forward got the wrong activation");
    WCHECK(p2p.sendBackwardRecvForward(g, grad, act).equal(a2), "fused recv-forward got the wrong activation");
  }
}

#ifndef TESSERA_PP_GPU_SUITE  // the Gloo suite only
TEST(Pipeline, TypedP2P) { expectAllOk(runWorkers("pp_p2p_typed", {.ranks = 2})); }
#endif

// A stage that throws in the middle of a step (micro-batch 2's forward, after the probe):
// the failing rank names the stage and micro-batch; every other rank ends too (its pending
// transfer fails when the peer's process exits, at the latest at the communicator's timeout).
TESSERA_WORKER(pp_fail_mid_step) {
  auto ctx = initWorker(w);
  const auto& g = ctx.world;
  const int P = g->size(), r = g->rank();
  auto m = makeModel(5);
  auto part = partitionModel(m, {.pp = P});
  auto st = buildStage(m, part, r);
  int calls = 0;
  PipelineExecutor::ChunkFn fn = [&](const at::Tensor& x) {
    if (r == 1 && at::GradMode::is_enabled() && calls++ == 2) throw std::runtime_error("injected failure");
    return st.forward(x);
  };
  PipelineExecutor exec(g, makeSchedule(ScheduleKind::OneFOneB, P, 4), {fn}, mse);
  exec.step(r == 0 ? randnSeeded({8, IN}, 1) : at::Tensor(), r == P - 1 ? randnSeeded({8, OUT}, 2) : at::Tensor());
  WCHECK(false, "rank {} finished the step although stage 1 failed", r);
}

#ifndef TESSERA_PP_GPU_SUITE  // the Gloo suite only
TEST(Pipeline, FailureMidStepEndsEveryRank) {
  RunOptions o;
  o.ranks = 4;
  o.killSiblingsOnFailure = false;
  o.env = {{"TESSERA_TIMEOUT_S", "10"}};
  auto res = runWorkers("pp_fail_mid_step", o);
  EXPECT_NE(res[1].output.find("forward of micro-batch 2 on stage 1 (pp rank 1, chunk 0) failed: injected failure"),
            std::string::npos)
      << res[1].output;
  for (const auto& rr : res) {
    EXPECT_FALSE(rr.killedByHarness) << "rank " << rr.rank << " hung:\n" << rr.output;
    EXPECT_EQ(rr.exitCode, 1) << "rank " << rr.rank << ":\n" << rr.output;
    EXPECT_EQ(rr.output.find("finished the step"), std::string::npos) << rr.output;
    EXPECT_LT(rr.seconds, 25) << rr.output;
  }
}
#endif

// A stage whose output changes on a later step while the input stays the same (so no probe
// re-learns the shapes): the output of micro-batch 1 on the second step gets one more
// feature (arg "shape") or becomes float64 ("dtype"), on pp rank 1 (pp rank 0 when pp = 2).
// That rank's send is refused, naming the shape announced and the one produced. Its peers
// wait for a transfer that never comes: they end with a communication error when its process
// exits, or, with "stay" (the failing rank catches the error and stays alive, its connections
// open, for 12 s), when their communicator's timeout expires.
TESSERA_WORKER(pp_output_changes) {
  auto ctx = initWorker(w);
  const auto& g = ctx.world;
  const int P = g->size(), r = g->rank(), bad = P > 2 ? 1 : 0, M = 4;
  const bool dtype = w.arg.find("dtype") != std::string::npos, stay = w.arg.find("stay") != std::string::npos;
  auto m = makeModel(5);
  auto part = partitionModel(m, {.pp = P});
  auto st = buildStage(m, part, r);
  int calls = 0;  // forwards with gradients (the shape probe runs without)
  PipelineExecutor::ChunkFn fn = [&](const at::Tensor& x) {
    auto y = st.forward(x);
    if (r == bad && at::GradMode::is_enabled() && calls++ == M + 1)
      return dtype ? y.to(at::kDouble) : at::cat({y, y.narrow(1, 0, 1)}, 1);
    return y;
  };
  PipelineExecutor exec(g, makeSchedule(ScheduleKind::OneFOneB, P, M), {fn}, mse);
  auto x = randnSeeded({8, IN}, 1), y = randnSeeded({8, OUT}, 2);
  for (int step = 0; step < 2; ++step) {
    try {
      exec.step(r == 0 ? x : at::Tensor(), r == P - 1 ? y : at::Tensor());
    } catch (const std::exception&) {
      if (stay && r == bad) std::this_thread::sleep_for(std::chrono::seconds(12));
      throw;
    }
  }
  WCHECK(false, "rank {} finished both steps although stage {}'s output changed", r, bad);
}

#ifndef TESSERA_PP_GPU_SUITE  // the Gloo suite only
namespace {
// Runs pp_output_changes; checks the failing rank's error and that every rank ended, with an
// error, by itself (not killed by the harness) and in bounded time. Returns the results.
std::vector<RankResult> runOutputChange(int ranks, const std::string& arg, int timeoutS,
                                        std::initializer_list<const char*> badError) {
  RunOptions o;
  o.ranks = ranks;
  o.arg = arg;
  o.killSiblingsOnFailure = false;
  o.env = {{"TESSERA_TIMEOUT_S", std::to_string(timeoutS)}};
  auto res = runWorkers("pp_output_changes", o);
  const int bad = ranks > 2 ? 1 : 0;
  for (const char* part : badError) EXPECT_NE(res[bad].output.find(part), std::string::npos) << part << "\n" << res[bad].output;
  for (const auto& rr : res) {
    EXPECT_FALSE(rr.killedByHarness) << "rank " << rr.rank << " hung:\n" << rr.output;
    EXPECT_NE(rr.exitCode, 0) << "rank " << rr.rank << ":\n" << rr.output;
    EXPECT_EQ(rr.output.find("finished both steps"), std::string::npos) << rr.output;
    EXPECT_LT(rr.seconds, timeoutS + 15) << "rank " << rr.rank << ":\n" << rr.output;
  }
  return res;
}
}  // namespace

TEST(Pipeline, OutputShapeChangeEndsEveryRank) {
  runOutputChange(4, "shape", 10,
                  {"send-fwd activation of micro-batch 1 on stage 1 (pp rank 1, chunk 0) as [2, 9] float32",
                   "the shape announced to rank 2 is [2, 8] float32"});
}

// The failing rank stays alive: its peers end by the communicator's timeout (4 s), while it
// still sleeps.
TEST(Pipeline, OutputDtypeChangeEndsPeersByTimeout) {
  auto res = runOutputChange(2, "dtype,stay", 4,
                             {"send-fwd activation of micro-batch 1 on stage 0 (pp rank 0, chunk 0) as [2, 8] float64",
                              "the shape announced to rank 1 is [2, 8] float32"});
  std::string out = res[1].output;
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return std::tolower(ch); });
  EXPECT_NE(out.find("timed out"), std::string::npos) << res[1].output;
  EXPECT_LT(res[1].seconds, res[0].seconds) << "rank 1 ended only after rank 0 exited:\n" << res[1].output;
}
#endif

TESSERA_WORKER(pp_errors) {
  auto ctx = initWorker(w);
  const auto& g = ctx.world;
  const int P = g->size(), r = g->rank();
  auto m = makeModel(5);
  auto x = randnSeeded({24, IN}, 1), y = randnSeeded({24, OUT}, 2);
  auto in = [&](const at::Tensor& t) { return r == 0 ? t : at::Tensor(); };
  auto tgt = [&](const at::Tensor& t) { return r == P - 1 ? t : at::Tensor(); };

  // Schedules: pure, so every rank throws the same.
  expectErrorContaining([&] { makeSchedule(ScheduleKind::OneFOneB, P, P - 1); },
                        {"1F1B needs at least as many micro-batches as pipeline stages", "pp = "});
  expectErrorContaining([&] { makeSchedule(ScheduleKind::Interleaved1F1B, P, P + 1, 2); }, {"multiple of pp"});

  auto exec = makeExecutor(g, m, {ScheduleKind::OneFOneB, 4, 1});
  expectErrorContaining([&] { exec->step(in(x.narrow(0, 0, 10)), tgt(y.narrow(0, 0, 10))); },
                        {"a batch of 10 samples is not divisible into 4 micro-batches"});
  expectErrorContaining([&] { exec->step(in(x), tgt(y.narrow(0, 0, 12))); },
                        {"the input batch has 24 samples but the target batch 12"});

  // The ranks disagree on the schedule (pp rank 0 warms up with one more forward): every rank
  // throws the same error, from the preamble, before any activation moves.
  auto odd = makeExecutor(g, m, {ScheduleKind::OneFOneB, 4, 1, r == 0 ? 1 : 0});
  expectErrorContaining([&] { odd->step(in(x), tgt(y)); },
                        {"the pp ranks disagree on the schedule", "and 1 extra warm-up forwards", "with 4 x 1 and 0"});

  // Stage 0 emits 9 features where stage 1 takes 8: every rank names stage 1 and the shape.
  torch::manual_seed(9);
  torch::nn::Linear bad(IN, D + 1), mid(D, D), head(D, OUT);
  std::vector<PipelineExecutor::ChunkFn> fns{[&](const at::Tensor& t) {
    if (r == 0) return bad->forward(t);
    auto h = mid->forward(t);
    return r == P - 1 ? head->forward(h) : h;
  }};
  PipelineExecutor broken(g, makeSchedule(ScheduleKind::OneFOneB, P, 4), fns, mse);
  expectErrorContaining([&] { broken.step(in(x), tgt(y)); }, {"stage 1 (pp rank 1, chunk 0)", "[6, 9] float32"});

  // The communicator is still usable: a correct step goes through.
  auto loss = exec->step(in(x), tgt(y));
  WCHECK(std::isfinite(loss.item<double>()), "loss after the errors is {}", loss.item<double>());
}

#ifndef TESSERA_PP_GPU_SUITE  // the Gloo suite only
TEST(Pipeline, ErrorsEndEveryRankPp2) { expectAllOk(runWorkers("pp_errors", {.ranks = 2})); }
TEST(Pipeline, ErrorsEndEveryRankPp4) { expectAllOk(runWorkers("pp_errors", {.ranks = 4})); }
#endif
