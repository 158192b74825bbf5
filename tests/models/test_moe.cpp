// The mixture-of-experts layer (models/moe.h):
// - Golden: the layer against an independent PyTorch MoE written with Hugging Face's conventions
//   (tests/models/moe_golden.py: Mixtral/Qwen3-MoE softmax routing, DeepSeek-V3 sigmoid routing
//   with a selection bias, a shared expert, the per-layer load-balancing and z losses): output,
//   input gradient and every weight's gradient.
// - Routing edge cases: ties, every token to one expert (with and without a capacity), an expert
//   with no tokens, the selection bias's update, the benchmarks' forced-balanced routing.
// - Expert parallel on Gloo (ep 2 and 4) against one process holding every expert: outputs,
//   gradients and weights after three SGD steps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "harness/multiprocess.h"
#include "tessera/common/error.h"
#include "tessera/models/moe.h"

using namespace tessera;
using namespace tessera::models;
using namespace tessera::testing;

namespace {

ModelConfig moeConfig(int variant) {
  auto c = presetConfig("moe-tiny");
  c.d = 32;
  c.moe.expertFfn = 24;
  c.moe.auxLossCoef = 0.01;
  c.moe.zLossCoef = 0.001;
  if (variant == 1) {  // DeepSeek-V3 style: sigmoid scores, a selection bias, routed scale, shared expert
    c.moe.score = RouterScore::Sigmoid;
    c.moe.routedScale = 2.5;
    c.moe.biasUpdateRate = 0.01;
    c.moe.topK = 3;
  } else if (variant == 2) {  // Qwen3-MoE without renormalisation, no shared expert
    c.moe.normTopK = false;
    c.moe.sharedFfn = 0;
  }
  return c;
}

void dump(const std::string& file, int variant) {
  const auto c = moeConfig(variant);
  Moe m(c, 1, MoeOptions{});
  if (variant == 1) m->bias.copy_(at::linspace(-0.2, 0.2, c.moe.experts));
  at::manual_seed(5);
  auto x = at::randn({5, 3, c.d}).requires_grad_();
  auto g = at::randn({5, 3, c.d});
  auto y = m->forward(x);
  (y * g).sum().backward();
  const auto st = m->takeStats();
  c10::Dict<std::string, at::Tensor> d;
  d.insert("x", x.detach());
  d.insert("g", g);
  d.insert("y", y.detach());
  d.insert("grad.x", x.grad());
  d.insert("bias", m->bias.clone());
  d.insert("config",
           at::tensor({double(c.d), double(c.moe.experts), double(c.moe.topK), double(c.expertFfn()),
                       double(c.moe.sharedFfn), double(c.moe.score == RouterScore::Sigmoid), double(c.moe.normTopK),
                       c.moe.routedScale, c.moe.auxLossCoef, c.moe.zLossCoef, st.auxLoss, st.zLoss},
                      at::kDouble));
  for (const auto& p : m->params("")) {
    d.insert("param." + p.name, p.tensor.detach());
    d.insert("grad." + p.name, p.tensor.grad());
  }
  const auto bytes = torch::pickle_save(c10::IValue(d));
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST(MoeGolden, MatchesAnIndependentHuggingFaceStyleMoe) {
  for (int variant : {0, 1, 2}) {
    const auto file = std::filesystem::temp_directory_path() / fmt::format("tessera-moe-{}-{}.pt", ::getpid(), variant);
    dump(file.string(), variant);
    const auto cmd =
        fmt::format("/usr/bin/python3 {}/tests/models/moe_golden.py {}", TESSERA_SOURCE_DIR, file.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << " (variant " << variant << ")";
    std::filesystem::remove(file);
  }
}

TEST(MoeRouting, TiesGoToTheLowerExperts) {
  auto c = moeConfig(0);
  Moe m(c, 1, MoeOptions{});
  auto x = at::randn({7, c.d});
  {
    at::NoGradGuard ng;
    m->router.zero_();  // every score equal
    m->forward(x);      // without autograd (validation, a shape probe): not counted
  }
  EXPECT_EQ(m->takeStats().load.sum().item<int64_t>(), 0);
  m->forward(x);
  auto load = m->takeStats().load;
  EXPECT_EQ(load[0].item<int64_t>(), 7);
  EXPECT_EQ(load[1].item<int64_t>(), 7);
  EXPECT_EQ(load.sum().item<int64_t>(), 14);
}

TEST(MoeRouting, EveryTokenToOneExpertWithAndWithoutCapacity) {
  for (double capacity : {0.0, 1.0}) {
    auto c = moeConfig(2);
    c.moe.topK = 1;
    c.moe.capacityFactor = capacity;
    Moe m(c, 1, MoeOptions{});
    {
      at::NoGradGuard ng;
      m->router.zero_();
      m->router[3].fill_(1.0);
    }
    const int64_t n = 64;
    auto x = at::rand({n, c.d}) + 0.1;  // positive: expert 3's logit wins for every token
    auto y = m->forward(x);
    y.sum().backward();
    const auto st = m->takeStats();
    const int64_t kept = capacity > 0 ? n / c.moe.experts : n;  // ceil(1 · 64 · 1 / 8) = 8
    EXPECT_EQ(st.load[3].item<int64_t>(), kept) << "capacity " << capacity;
    EXPECT_EQ(st.dropped, n - kept) << "capacity " << capacity;
    // Dropped tokens (no shared expert) get nothing: the first `kept` tokens in token order are served.
    EXPECT_TRUE(y.narrow(0, kept, n - kept).eq(0).all().item<bool>());
    EXPECT_FALSE(y.narrow(0, 0, kept).eq(0).all().item<bool>());
    // Experts without tokens: a zero gradient, not a missing one.
    ASSERT_TRUE(m->w1.grad().defined());
    EXPECT_TRUE(m->w1.grad()[0].eq(0).all().item<bool>());
    EXPECT_FALSE(m->w1.grad()[3].eq(0).all().item<bool>());
  }
}

TEST(MoeRouting, BiasMovesTowardsTheMeanLoad) {
  auto c = moeConfig(1);
  c.moe.topK = 1;
  Moe m(c, 1, MoeOptions{});
  {
    at::NoGradGuard ng;
    m->router.zero_();
    m->router[3].fill_(1.0);
  }
  m->forward(at::rand({16, c.d}) + 0.1);
  m->updateBias({});
  EXPECT_FLOAT_EQ(m->bias[3].item<float>(), -0.01f);        // overloaded: down
  EXPECT_FLOAT_EQ(m->bias[0].item<float>(), 0.01f);         // idle: up
  EXPECT_EQ(m->takeStats().load.sum().item<int64_t>(), 0);  // the update consumed the load
}

// Benchmarks' forced-balanced routing: token i to experts (i k + j) mod E whatever the router says, each weighted
// by the router's probability of it, and the router still learns.
TEST(MoeRouting, ForceBalancedChoosesByPosition) {
  auto c = moeConfig(2);  // no shared expert, probabilities not renormalised
  MoeOptions o;
  o.forceBalanced = true;
  Moe m(c, 1, o);
  {
    at::NoGradGuard ng;
    m->router[3].fill_(1.0);  // the router prefers expert 3 for every positive token
  }
  const int64_t n = 12, k = c.moe.topK, e = c.moe.experts;
  auto x = at::rand({n, c.d}) + 0.1;
  auto y = m->forward(x);
  y.sum().backward();
  const auto load = m->takeStats().load;
  EXPECT_TRUE(load.eq(n * k / e).all().item<bool>()) << load;  // 12 tokens x top 2 over 8 experts: 3 each
  at::NoGradGuard ng;
  const auto p = at::softmax(at::linear(x, m->router), -1);
  for (int64_t i = 0; i < n; ++i) {
    auto want = at::zeros({c.d});
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = (i * k + j) % e;
      auto h = at::silu(at::mv(m->w1[ex], x[i])) * at::mv(m->w3[ex], x[i]);
      want += p[i][ex] * at::mv(m->w2[ex], h);
    }
    EXPECT_TRUE(at::allclose(y[i], want, 1e-5, 1e-6)) << "token " << i;
  }
  ASSERT_TRUE(m->router.grad().defined());
  EXPECT_GT(m->router.grad().abs().sum().item<double>(), 0);
}

TEST(MoeRouting, BadShapesAreNamed) {
  auto c = moeConfig(0);
  Moe m(c, 2, MoeOptions{});
  expectErrorContaining([&] { m->forward(at::randn({4, c.d + 1})); }, {"blocks.2.moe", "input must be [..., 32]"});
  c.moe.topK = 9;
  expectErrorContaining([&] { validate(c); }, {"top-k 9", "experts = 8"});
}

namespace {

// Rank r's tokens and output gradient at step `step`: the same on every rank for every r.
std::pair<at::Tensor, at::Tensor> epBatch(const ModelConfig& c, int step, int r) {
  at::manual_seed(100 * step + r);
  return {at::randn({6, 2, c.d}), at::randn({6, 2, c.d})};
}

// Forward and backward of `m` on rank r's batch; returns the output and the input's gradient.
std::pair<at::Tensor, at::Tensor> epStep(Moe& m, const ModelConfig& c, int step, int r) {
  auto [x, g] = epBatch(c, step, r);
  x.requires_grad_();
  auto y = m->forward(x);
  (y * g).sum().backward();
  return {y.detach(), x.grad()};
}

// One SGD step with data parallelism's mean over the group of `p` ranks: the replicated weights'
// gradients averaged over `group` (the expert-parallel layer), the experts' taken as they are (their
// mean over the ep ranks already); the one-process layer (no group) saw all p ranks' tokens: / p.
void sgd(Moe& m, const CommPtr& group, int p) {
  at::NoGradGuard ng;
  for (auto& param : m->params("")) {
    auto g = param.tensor.grad();
    if (!group) {
      g.div_(p);
    } else if (!param.expert) {
      group->allReduce(g, ReduceOp::Avg)->wait();
    }
    param.tensor.sub_(0.5 * g);
    g.zero_();
  }
}

bool close(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && (a - b).abs().max().item<double>() <= 1e-5 * (1 + b.abs().max().item<double>());
}

}  // namespace

// Every rank runs the expert-parallel layer on its tokens and, beside it, the one-process layer
// holding every expert on every rank's tokens in turn.
TESSERA_WORKER(moe_expert_parallel) {
  auto ctx = initWorker(w);
  const int p = w.world, r = w.rank;
  // Variant 3: variant 1 with the selection bias sending every token to experts 0-2, so the ep ranks
  // holding the others receive no rows (their experts' gradients zero; backward still exchanges).
  const int variant = std::stoi(w.arg);
  auto c = moeConfig(variant == 3 ? 1 : variant);
  {
    auto odd = c;
    odd.moe.experts = 6;
    if (p == 4)
      expectErrorContaining([&] { Moe(odd, 1, MoeOptions{ctx.world}); }, {"6 experts", "expert-parallel size 4"});
  }
  Moe ep(c, 1, MoeOptions{ctx.world}), ref(c, 1, MoeOptions{});
  if (variant == 3) {
    for (auto* m : {&ep, &ref}) (*m)->bias.zero_().narrow(0, 0, 3).fill_(10.0);
  }
  WCHECK(ep->localExperts() == c.moe.experts / p && ep->firstExpert() == r * c.moe.experts / p, "expert range");
  for (int step = 0; step < 3; ++step) {
    auto [y, gx] = epStep(ep, c, step, r);
    for (int q = 0; q < p; ++q) {
      auto [ry, rgx] = epStep(ref, c, step, q);
      if (q == r)
        WCHECK(close(y, ry) && close(gx, rgx), "step {}: rank {}'s output or input gradient differs", step, r);
    }
    for (auto& [name, t] :
         std::vector<std::pair<std::string, at::Tensor>>{{"w1", ep->w1}, {"w3", ep->w3}, {"w2", ep->w2}}) {
      auto want = (name == "w1"   ? ref->w1
                   : name == "w3" ? ref->w3
                                  : ref->w2)
                      .grad()
                      .narrow(0, ep->firstExpert(), ep->localExperts()) /
                  p;  // the mean over the ep ranks' tokens
      WCHECK(close(t.grad(), want), "step {}: {}'s gradient of experts {}.. differs", step, name, ep->firstExpert());
      if (variant == 3 && ep->firstExpert() >= 3)
        WCHECK(t.grad().abs().max().item<double>() == 0, "step {}: experts without tokens got a gradient", step);
    }
    auto routerGrad = ep->router.grad().clone();
    ctx.world->allReduce(routerGrad)->wait();
    WCHECK(close(routerGrad, ref->router.grad()), "step {}: the router's gradient summed over ranks differs", step);
    sgd(ep, ctx.world, p);
    sgd(ref, nullptr, p);
  }
  WCHECK(close(ep->w2, ref->w2.narrow(0, ep->firstExpert(), ep->localExperts())) && close(ep->router, ref->router),
         "weights after three steps differ");
  if (ep->sw1.defined()) WCHECK(close(ep->sw1, ref->sw1), "shared weights after three steps differ");
  // The load summed over the group equals the one-process layer's.
  auto load = ep->takeStats().load.to(at::kFloat);
  ctx.world->allReduce(load)->wait();
  WCHECK(load.equal(ref->takeStats().load.to(at::kFloat)), "the summed expert load differs");
}

TEST(MoeExpertParallel, MatchesOneProcess) {
  for (int ranks : {2, 4}) {
    for (int variant : {0, 1, 3}) {
      expectAllOk(runWorkers("moe_expert_parallel", {.ranks = ranks, .arg = std::to_string(variant)}));
    }
  }
}
