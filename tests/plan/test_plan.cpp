// The layout planner (src/plan/) against what can be worked out by hand from a made-up calibration:
// GEMM and attention lookups scale their nearest sample, a link interpolates its bus bandwidth, a
// collective takes nccl-tests' bytes over it; a single-GPU step is the sum of its ops; data
// parallelism adds exactly the exposed and the overlap-weighted hidden communication; a pipeline's
// step is the simulator's makespan of the stage costs; FSDP holds less than DDP; the refusals name
// their reason; search ranks what it predicts and refuses the rest; the JSON, layout and model
// spellings round-trip or fail naming the token; and a calibration measured on this CPU holds every
// linear of the model it was asked for.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tessera/common/error.h"
#include "tessera/parallel/pipeline/simulate.h"
#include "tessera/plan/measure.h"
#include "tessera/plan/search.h"

using namespace tessera;
using namespace tessera::plan;

namespace {

// Every GEMM 1 ms per GFLOP-ish unit: ms = m·n·k / 1e9 (one sample per op, scaled by FLOPs).
Calibration madeUp() {
  Calibration c;
  c.card = "test card";
  c.memoryGiB = 80;
  for (const char* op : {"fwd", "dgrad", "wgrad"}) {
    c.gemms.push_back({op, 1000, 1000, 1000, false, 1.0});
    c.gemms.push_back({op, 1000, 1000, 1000, true, 0.5});
  }
  c.attention.push_back({1, 4, 2, 64, 16, 0.2, 0.4});
  for (const char* k : {"norm", "layernorm", "swiglu", "gelu", "rope", "cast", "cross_entropy", "embedding", "add"}) {
    c.elementNs[k] = 0.001;
  }
  c.adamwNsPerParam = 0.01;
  c.overlapSlowdown = 0.5;
  c.intraNode.name = "test link";
  c.intraNode.latencyUs = 0;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}) {
    c.intraNode.busGBs[op] = {{1e6, 10.0}, {1e8, 100.0}};
  }
  return c;
}

Cluster clusterOf(const Calibration& cal, int gpus) {
  Cluster c;
  c.gpus = gpus;
  c.gpusPerNode = 8;
  c.memoryGiB = 80;
  c.intra = cal.intraNode;
  c.inter = cal.intraNode;
  return c;
}

Workload tinyWork(int64_t batch) {
  Workload w;
  w.model = models::presetConfig("llama-tiny");
  w.seqLen = 64;
  w.globalBatch = batch;
  return w;
}

}  // namespace

TEST(PlanCalibration, LookupsScaleTheNearestSample) {
  const Calibration c = madeUp();
  EXPECT_DOUBLE_EQ(c.gemmMs("fwd", 1000, 1000, 1000, false), 1.0);
  EXPECT_NEAR(c.gemmMs("wgrad", 2000, 1000, 500, false), 1.0, 1e-12);  // same FLOPs
  EXPECT_NEAR(c.gemmMs("dgrad", 4000, 1000, 1000, true), 2.0, 1e-12);
  auto [f, b] = c.attentionMs(2, 4, 2, 128, 16);  // 2 × batch, 4 × seq² → 8 ×
  EXPECT_NEAR(f, 1.6, 1e-12);
  EXPECT_NEAR(b, 3.2, 1e-12);
  EXPECT_NEAR(c.elementMs("norm", 1e6), 1e-3, 1e-15);
  EXPECT_THROW(c.elementMs("nope", 1), Error);
  Calibration empty;
  try {
    empty.gemmMs("fwd", 1, 1, 1, false);
    FAIL() << "no GEMM measured";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no bf16 fwd GEMM"), std::string::npos) << e.what();
  }
}

TEST(PlanCalibration, LinksInterpolateInLogBytesAndScaleByRanks) {
  Link l = madeUp().intraNode;
  EXPECT_DOUBLE_EQ(l.busbw("all_reduce", 1e5), 10.0);   // below the samples: the first
  EXPECT_NEAR(l.busbw("all_reduce", 1e7), 55.0, 1e-9);  // halfway in log
  EXPECT_DOUBLE_EQ(l.busbw("all_reduce", 1e9), 100.0);
  l.rankScale = {{4, 0.5}};
  EXPECT_DOUBLE_EQ(l.busbw("all_reduce", 1e9, 2), 100.0);
  EXPECT_DOUBLE_EQ(l.busbw("all_reduce", 1e9, 8), 50.0);
}

TEST(PlanCalibration, ContextParallelTakesItsOwnGroupSizeElseAShareOfAGroupOfOne) {
  Calibration c = madeUp();
  c.cpAttention.push_back({1, 4, 2, 64, 16, 0.1, 0.2});  // a group of one
  AttentionSample two{1, 4, 2, 256, 16, 0.6, 1.2};       // rank 0 of cp 2 at seq 256
  two.cp = 2;
  c.cpAttention.push_back(two);
  auto [f2, b2] = c.attentionMs(1, 4, 2, 512, 16, 2);  // cp 2's sample, 4 × seq², not halved
  EXPECT_NEAR(f2, 2.4, 1e-12);
  EXPECT_NEAR(b2, 4.8, 1e-12);
  auto [f4, b4] = c.attentionMs(1, 4, 2, 128, 16, 4);  // no cp 4 sample: the group of one's, 4 ×, a quarter
  EXPECT_NEAR(f4, 0.1, 1e-12);
  EXPECT_NEAR(b4, 0.2, 1e-12);
  auto [f1, b1] = c.attentionMs(1, 4, 2, 64, 16, 1);  // no context parallel: plain causal attention's
  EXPECT_NEAR(f1, 0.2, 1e-12);
  const Calibration back = calibrationFromJson(calibrationToJson(c), "test");
  ASSERT_EQ(back.cpAttention.size(), 2u);
  EXPECT_EQ(back.cpAttention[0].cp, 1);
  EXPECT_EQ(back.cpAttention[1].cp, 2);
}

TEST(PlanCalibration, JsonRoundTripsAndNamesWhatIsMissing) {
  const Calibration c = madeUp();
  const Calibration back = calibrationFromJson(calibrationToJson(c), "test");
  EXPECT_EQ(back.card, c.card);
  ASSERT_EQ(back.gemms.size(), c.gemms.size());
  EXPECT_EQ(back.gemms[1].fp8, true);
  EXPECT_EQ(back.attention[0].backwardMs, 0.4);
  EXPECT_EQ(back.intraNode.busbw("all_gather", 1e7), c.intraNode.busbw("all_gather", 1e7));
  try {
    calibrationFromJson(R"({"card": "x", "memory_gib": 1})", "f.json");
    FAIL() << "missing fields";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.json (x): missing field 'peak_tflops_bf16'"), std::string::npos)
        << e.what();
  }
}

TEST(PlanPredict, DataParallelAddsItsExposedAndWeightedHiddenCommunication) {
  const Calibration cal = madeUp();
  const Workload one = tinyWork(2), four = tinyWork(8);
  Layout single;
  single.microBatch = 2;
  const Prediction s = predict(one, single, clusterOf(cal, 1), cal);
  EXPECT_DOUBLE_EQ(s.exposedCommMs + s.hiddenCommMs + s.bubbleMs, 0.0);
  EXPECT_NEAR(s.stepMs, s.computeMs + s.optimizerMs, 1e-9);
  Layout ddp = single;
  ddp.dp = 4;
  const Prediction d = predict(four, ddp, clusterOf(cal, 4), cal);
  EXPECT_NEAR(d.computeMs, s.computeMs, 1e-9);  // the same work per GPU
  EXPECT_GT(d.exposedCommMs + d.hiddenCommMs, 0.0);
  EXPECT_NEAR(d.stepMs, s.stepMs + d.exposedCommMs + cal.overlapSlowdown * d.hiddenCommMs, 1e-9);
  Layout fsdp = ddp;
  fsdp.sharding = Sharding::Fsdp;
  EXPECT_LT(predictMemory(four, fsdp, clusterOf(cal, 4)).memoryGiB,
            predictMemory(four, ddp, clusterOf(cal, 4)).memoryGiB);
  EXPECT_LT(predict(four, fsdp, clusterOf(cal, 4), cal).optimizerMs, d.optimizerMs);
}

TEST(PlanCollectives, AllReduceMovesTwiceTheRingShare) {
  const Calibration cal = madeUp();
  Workload w = tinyWork(8);
  Layout l;
  l.dp = 4;
  l.microBatch = 2;
  const Prediction p = predict(w, l, clusterOf(cal, 4), cal);
  // One bucket (the tiny model's float32 gradients are under 25 MiB): 2·3/4 of its bytes over the link.
  const double bytes = 4.0 * models::paramCount(w.model);
  const double expect = bytes * 1.5 / (cal.intraNode.busbw("all_reduce", bytes) * 1e6);
  EXPECT_NEAR(p.exposedCommMs + p.hiddenCommMs, expect, 1e-9);
}

TEST(PlanPredict, PipelineStepIsTheSimulatedMakespan) {
  const Calibration cal = madeUp();
  Workload w = tinyWork(8);
  Layout l;
  l.pp = 2;
  l.microBatches = 8;
  const Prediction p = predict(w, l, clusterOf(cal, 2), cal);
  EXPECT_GT(p.bubbleMs, 0.0);
  EXPECT_NEAR(p.stepMs, p.computeMs + p.bubbleMs + p.optimizerMs, 1e-9);
  l.microBatches = 4, w.globalBatch = 4;
  EXPECT_GT(predict(w, l, clusterOf(cal, 2), cal).bubbleMs / 4,
            p.bubbleMs / 8);  // fewer micro-batches: more bubble each
}

TEST(PlanPredict, RefusalsNameTheirReason) {
  const Calibration cal = madeUp();
  const Workload w = tinyWork(8);
  auto why = [&](const std::string& layout, int gpus) {
    return refusal(w, parseLayout(layout), clusterOf(cal, gpus), cal);
  };
  EXPECT_NE(why("dp=2,mb=4,m=1", 4).find("not the cluster's 4 GPUs"), std::string::npos);
  EXPECT_NE(why("tp=8,mb=8", 8).find("tp 8 does not divide the heads (4)"), std::string::npos);
  EXPECT_NE(why("dp=2,mb=1,m=1", 2).find("≠ the global batch 8"), std::string::npos);
  EXPECT_NE(why("dp=2,pp=2,fsdp,mb=1,m=4,zb-h1", 4).find("FSDP is refused with ZB-H1"), std::string::npos);
  EXPECT_NE(why("pp=8,mb=1,m=8", 8).find("4 layers cannot fill pp 8"), std::string::npos);
  EXPECT_EQ(why("dp=2,mb=4,m=1", 2), "");
  Workload big = w;
  big.model = models::presetConfig("llama3-8b");
  big.seqLen = 8192;
  EXPECT_NE(refusal(big, parseLayout("dp=1,mb=8,m=1"), clusterOf(cal, 1), cal).find("GiB per GPU of 80"),
            std::string::npos);
  EXPECT_THROW(predict(big, parseLayout("dp=1,mb=8,m=1"), clusterOf(cal, 1), cal), Error);
}

TEST(PlanPredict, MixtureOfExpertsModelsAreRefusedByName) {
  // Costed as their dense shape they would get a confident, wrong answer; every entry point refuses.
  const Calibration cal = madeUp();
  Workload w = tinyWork(8);
  w.model = models::presetConfig("moe-tiny");
  const Layout l = parseLayout("dp=2,mb=4,m=1");
  const Cluster c = clusterOf(cal, 2);
  for (const auto& call :
       std::vector<std::function<void()>>{[&] { refusal(w, l, c, cal); }, [&] { predict(w, l, c, cal); },
                                          [&] { predictMemory(w, l, c); }, [&] { search(w, c, cal); }}) {
    try {
      call();
      ADD_FAILURE() << "an MoE workload was planned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the model has " + std::to_string(w.model.moe.experts) + " experts"),
                std::string::npos)
          << e.what();
    }
  }
  w.model.moe.experts = 0;  // the same model made dense is planned
  EXPECT_EQ(refusal(w, l, c, cal), "");
}

TEST(PlanSearch, RanksWhatFitsAndRefusesTheRest) {
  const Calibration cal = madeUp();
  const SearchResult r = search(tinyWork(8), clusterOf(cal, 4), cal);
  ASSERT_FALSE(r.ranked.empty());
  ASSERT_FALSE(r.refused.empty());
  for (size_t i = 1; i < r.ranked.size(); ++i) {
    EXPECT_GE(r.ranked[i - 1].prediction.tokensPerSPerGpu, r.ranked[i].prediction.tokensPerSPerGpu);
  }
  for (const auto& p : r.ranked) EXPECT_EQ(refusal(p.work, p.layout, clusterOf(cal, 4), cal), "");
  for (const auto& x : r.refused) EXPECT_FALSE(x.reason.empty()) << describe(x.layout);
}

TEST(PlanLayout, SpellingsRoundTripAndBadTokensAreNamed) {
  for (const char* s :
       {"dp=4,tp=2,pp=1,cp=1,fsdp,mb=1,m=8,keep,shardacc", "dp=1,tp=2,pp=4,cp=1,ddp,nosp,mb=1,m=16,zb-h1",
        "dp=2,tp=1,pp=2,cp=2,hsdp,mb=2,m=4,interleaved,vp=2"}) {
    EXPECT_EQ(describe(parseLayout(s)), s);
  }
  EXPECT_EQ(parseLayout("pp=2,zbv").chunks, 2);
  try {
    parseLayout("dp=2,bogus");
    FAIL() << "bogus";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown token 'bogus'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parseLayout("dp=0"), Error);
  const auto m = modelFromSpec("llama3-8b:layers=4,d=8192,heads=64,kv=8,ffn=28672,vocab=32000");
  EXPECT_EQ(m.layers, 4);
  EXPECT_EQ(m.d, 8192);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_THROW(modelFromSpec("llama3-8b:width=3"), Error);
  EXPECT_THROW(modelFromSpec("no-such-preset"), Error);
}

TEST(PlanMeasure, ACpuCalibrationHoldsEveryLinearOfTheModel) {
  MeasureOptions o;
  o.models = {models::presetConfig("llama-tiny")};
  o.tp = {1, 2};
  o.tokens = {64};
  o.seqs = {64};
  const Calibration c = measureCalibration(o);
  EXPECT_EQ(c.card, "CPU");
  // Every linear at tp 1 and 2 has its three GEMMs measured at exactly its shape (no FP8 on a CPU;
  // shapes two linears share are measured once).
  const auto& m = o.models[0];
  const int64_t hd = m.headDim();
  for (int tp : {1, 2}) {
    const std::vector<std::pair<int64_t, int64_t>> linears = {{m.d, (m.heads + 2 * m.kvH()) * hd / tp},
                                                              {m.heads * hd / tp, m.d},
                                                              {m.d, 2 * m.ffnSize() / tp},
                                                              {m.ffnSize() / tp, m.d},
                                                              {m.d, (m.vocab / tp + 7) / 8 * 8}};
    for (auto [in, out] : linears) {
      int found = 0;
      for (const auto& g : c.gemms) {
        found += (g.op == "fwd" && g.m == 64 && g.n == out && g.k == in) +
                 (g.op == "dgrad" && g.n == in && g.k == out) +
                 (g.op == "wgrad" && g.m == out && g.n == in && g.k == 64);
      }
      EXPECT_GE(found, 3) << "tp " << tp << ": [" << in << " x " << out << "]";
    }
  }
  EXPECT_EQ(c.attention.size(), 2u);
  for (const auto& g : c.gemms) EXPECT_GT(g.ms, 0.0);
  EXPECT_FALSE(c.gemms[0].fp8);
  EXPECT_GT(c.adamwNsPerParam, 0.0);
  EXPECT_GT(c.elementMs("swiglu", 1e6), 0.0);
}

// simulatePipeline simulates cap = 4·pp·chunks and 2·cap micro-batches and extends that slope to longer
// steps: the full simulation must agree (unbalanced stages, transfers) within 1 %.
TEST(PlanPipeline, LongStepsExtendAlongTheSlopeOfTwoShorterOnes) {
  using pipeline::ScheduleKind;
  for (auto [kind, chunks] : {std::pair{ScheduleKind::OneFOneB, 1}, std::pair{ScheduleKind::Interleaved1F1B, 2},
                              std::pair{ScheduleKind::ZeroBubbleH1, 1}, std::pair{ScheduleKind::ZeroBubbleV, 2}}) {
    const int pp = 4, cap = 4 * pp * chunks, more = 3 * cap;
    const pipeline::Schedule s = pipeline::makeSchedule(kind, pp, more, chunks);
    std::vector<pipeline::StageCost> costs;
    for (int st = 0; st < s.numStages(); ++st) costs.push_back({1.0 + 0.3 * (st % 3), 2.0 + 0.2 * st, 0.7});
    const double full = pipeline::simulateStep(s, costs, 0.05).step;
    const double a = pipeline::simulateStep(pipeline::makeSchedule(kind, pp, cap, chunks), costs, 0.05).step;
    const double b = pipeline::simulateStep(pipeline::makeSchedule(kind, pp, 2 * cap, chunks), costs, 0.05).step;
    EXPECT_NEAR(b + (b - a), full, 0.01 * full) << pipeline::toString(kind);
  }
}
