// src/optim: the learning-rate schedules as tables (pure functions of the step) and their bad
// options; the weight-decay rule by parameter name; AdamW's step with a gradient scale; the
// gradient norm's weighting and clipping coefficient (no ranks).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tessera/common/error.h"
#include "tessera/optim/adamw.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/parallel/grad_norm.h"

using namespace tessera;
using namespace tessera::optim;

namespace {

LrSchedule sched(LrKind k, int64_t warmup, int64_t total, int64_t decay = 0) {
  LrSchedule s;
  s.kind = k;
  s.lr = 1.0;
  s.minLr = 0.1;
  s.warmup = warmup;
  s.total = total;
  s.decay = decay;
  validate(s);
  return s;
}

void expectTable(const LrSchedule& s, const std::vector<std::pair<int64_t, double>>& table) {
  for (const auto& [step, lr] : table) EXPECT_NEAR(lrAt(s, step), lr, 1e-12) << toString(s.kind) << " step " << step;
}

TEST(LrSchedule, Tables) {
  // Warm-up: step s (0-based) takes lr (s + 1) / warmup.
  expectTable(sched(LrKind::Constant, 4, 10), {{0, 0.25}, {1, 0.5}, {3, 1.0}, {4, 1.0}, {9, 1.0}, {50, 1.0}});
  // Cosine from lr at the end of warm-up (step 4) to minLr at step 12: half way (step 8) the mean.
  const double mid = 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5));
  expectTable(sched(LrKind::Cosine, 4, 12), {{0, 0.25}, {4, 1.0}, {8, mid}, {12, 0.1}, {13, 0.1}});
  EXPECT_NEAR(mid, 0.55, 1e-12);
  // Linear over the same span.
  expectTable(sched(LrKind::Linear, 4, 12), {{4, 1.0}, {6, 1.0 - 0.9 * 0.25}, {8, 0.55}, {11, 1.0 - 0.9 * 7 / 8.0}, {12, 0.1}});
  // WSD: warm-up 2, stable until the last 4 of 12 steps, then linear to minLr.
  expectTable(sched(LrKind::Wsd, 2, 12, 4), {{0, 0.5}, {1, 1.0}, {2, 1.0}, {7, 1.0}, {8, 1.0}, {10, 0.55}, {12, 0.1}});
  // WSD's default decay: the last fifth.
  expectTable(sched(LrKind::Wsd, 0, 10), {{7, 1.0}, {8, 1.0}, {9, 0.55}, {10, 0.1}});
  // No warm-up: the first step takes lr.
  expectTable(sched(LrKind::Cosine, 0, 10), {{0, 1.0}, {10, 0.1}});
}

TEST(LrSchedule, BadOptionsNameTheOption) {
  auto bad = [](auto edit, const char* what) {
    LrSchedule s;
    s.total = 10;
    edit(s);
    try {
      validate(s);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  bad([](LrSchedule& s) { s.lr = 0; }, "lr must be > 0");
  bad([](LrSchedule& s) { s.minLr = 2 * s.lr; }, "min lr");
  bad([](LrSchedule& s) { s.warmup = 11; }, "warm-up of 11 steps in a run of 10");
  bad([](LrSchedule& s) { s.kind = LrKind::Wsd, s.warmup = 5, s.decay = 6; }, "exceed the run of 10");
  EXPECT_THROW(parseLrKind("step"), Error);
  EXPECT_EQ(parseLrKind("wsd"), LrKind::Wsd);
}

// step(gradScale) on the CPU: the step on gradients multiplied by the scale first (in place).
TEST(AdamW, GradScaleIsTheStepOnScaledGradients) {
  at::manual_seed(3);
  std::vector<at::Tensor> p1, p2;
  for (int64_t n : {5, 300}) {
    auto t = at::randn({n});
    p1.push_back(t.clone().requires_grad_());
    p2.push_back(t.clone().requires_grad_());
  }
  const std::vector<std::string> names = {"blocks.0.w.weight", "norm.weight"};
  AdamWOptions o;
  AdamW a(p1, names, {true, false}, o), b(p2, names, {true, false}, o);
  const auto scale = at::full({1}, 0.25f);
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < p1.size(); ++i) {
      auto g = at::randn(p1[i].sizes());
      p1[i].mutable_grad() = g.clone();
      p2[i].mutable_grad() = g.mul(scale.reshape({}));
    }
    a.step(scale);
    b.step();
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_TRUE(at::equal(p1[i], p2[i])) << "step " << step << " " << names[i];
      EXPECT_TRUE(at::equal(a.expAvgSq()[i], b.expAvgSq()[i])) << "step " << step << " " << names[i];
    }
  }
  // The per-tensor path checks the scale as the multi-tensor kernel does.
  try {
    a.step(at::ones({2}));
    ADD_FAILURE() << "a two-element gradScale was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AdamW::step: gradScale must be one float32 value"), std::string::npos)
        << e.what();
  }
}

// Gradient-norm clipping without ranks (parallel/grad_norm.h): pieces weighted, the norm and
// the coefficient on the device; clipGlobalGradNorm scales in place by exactly that coefficient,
// and leaves gradients under the limit unchanged.
TEST(GradNorm, WeightedNormCoefficientAndInPlaceClip) {
  auto a = at::tensor({3.0f, 4.0f}), b = at::tensor({2.0f, 2.0f, 2.0f, 2.0f});
  // ‖a‖² = 25, ‖b‖² = 16 held by 2 ranks (weight 1/2): 25 + 8 = 33.
  const std::vector<GradPiece> pieces = {{a, 1.0}, {b, 0.5}};
  const auto n = globalGradNorm(pieces, {}, 1.0, at::kCPU);
  EXPECT_NEAR(n.norm.item<double>(), std::sqrt(33.0), 1e-6);
  EXPECT_FLOAT_EQ(n.coef.item<float>(), static_cast<float>(1.0 / (std::sqrt(33.0) + 1e-6)));
  EXPECT_FLOAT_EQ(globalGradNorm(pieces, {}, 0.0, at::kCPU).coef.item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(globalGradNorm(pieces, {}, 100.0, at::kCPU).coef.item<float>(), 1.0f);
  const auto a0 = a.clone(), b0 = b.clone();
  const double norm = clipGlobalGradNorm(pieces, {}, 1.0, at::kCPU);
  EXPECT_NEAR(norm, std::sqrt(33.0), 1e-6);
  EXPECT_TRUE(at::equal(a, a0 * n.coef.reshape({})) && at::equal(b, b0 * n.coef.reshape({})));
  const auto a1 = a.clone();
  clipGlobalGradNorm({{a, 1.0}}, {}, 100.0, at::kCPU);
  EXPECT_TRUE(at::equal(a, a1));
}

TEST(AdamW, DecayRuleByName) {
  for (const char* n : {"blocks.0.wqkv.weight", "blocks.3.qkv.weight", "blocks.1.fc1.weight", "head.weight",
                        "blocks.2.w13.weight"}) {
    EXPECT_TRUE(decaysByName(n, false)) << n;
  }
  for (const char* n : {"blocks.0.attn_norm.weight", "blocks.0.ln1.weight", "blocks.0.ln2.bias", "lnf.weight",
                        "norm.weight", "blocks.4.proj.bias", "blocks.4.fc2.bias"}) {
    EXPECT_FALSE(decaysByName(n, true)) << n;
  }
  EXPECT_TRUE(decaysByName("emb.weight", true));
  EXPECT_FALSE(decaysByName("emb.weight", false));
  EXPECT_FALSE(decaysByName("pos.weight", false));
}

}  // namespace
