// The training config's command line (src/train/config.h): the defaults of GPU and CPU runs and of the
// environment, switch values, errors that name the flag and the value, layout errors as
// UsageError, --help (the config file: test_config_file.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "tessera/train/config.h"

namespace {
using namespace tessera::train;
using namespace tessera::train::config_test;

TEST(ConfigTest, MachineDefaults) {
  const auto cpu = parse({});
  EXPECT_EQ(cpu.model.preset, "tiny");
  EXPECT_EQ(cpu.precision.precision, Precision::Fp32);
  EXPECT_FALSE(cpu.precision.fusedKernels);
  EXPECT_EQ(cpu.logging.peakTflops, 0);
  const auto gpu = parse({}, true);
  EXPECT_EQ(gpu.model.preset, "735m");
  EXPECT_EQ(gpu.model.cfg.d, 2048);
  EXPECT_EQ(gpu.precision.precision, Precision::Bf16);
  EXPECT_TRUE(gpu.precision.fusedKernels);
  EXPECT_EQ(gpu.logging.peakTflops, 989);
  EXPECT_EQ(parse({"--peak-tflops", "0"}, true).logging.peakTflops, 0);  // no MFU, also on GPUs
  EXPECT_EQ(parse({"--peak-tflops=312"}, true).logging.peakTflops, 312);
  EXPECT_FALSE(parse({"--fused-kernels", "auto"}).precision.fusedKernels);
  EXPECT_TRUE(parse({"--fused-kernels", "on"}).precision.fusedKernels);
  EXPECT_FALSE(parse({"--fused-kernels", "off"}, true).precision.fusedKernels);
}

TEST(ConfigTest, EnvironmentDefaultsAndSwitchesTurnThemOff) {
  tessera::Settings env;
  env.tpForwardChunks = 4;
  env.smCarveout = 8;
  env.tpRing = true;
  env.profile = "trace.json:4:2";
  const auto o = parse({}, false, env);
  EXPECT_EQ(o.parallel.overlap.forwardChunks, 4);
  EXPECT_EQ(o.parallel.overlap.smCarveout, 8);
  EXPECT_TRUE(o.parallel.overlap.ring);
  EXPECT_EQ(o.logging.profile, "trace.json:4:2");
  const auto off = parse({"--tp-ring=off", "--tp-forward-chunks", "1", "--profile="}, false, env);
  EXPECT_FALSE(off.parallel.overlap.ring);
  EXPECT_EQ(off.parallel.overlap.forwardChunks, 1);
  EXPECT_EQ(off.logging.profile, "");
}

TEST(ConfigTest, SwitchValues) {
  EXPECT_FALSE(parse({}).parallel.sequenceParallel);
  EXPECT_TRUE(parse({"--sp"}).parallel.sequenceParallel);
  for (const char* off : {"--sp=0", "--sp=false", "--sp=off", "--sp=no"})
    EXPECT_FALSE(parse({off}).parallel.sequenceParallel) << off;
  for (const char* on : {"--sp=1", "--sp=true", "--sp=on", "--sp=yes"}) EXPECT_TRUE(parse({on}).parallel.sequenceParallel) << on;
  EXPECT_FALSE(parse({"--no-fused-wgrad"}).precision.fusedWgrad);
  EXPECT_TRUE(parse({"--no-fused-wgrad=off"}).precision.fusedWgrad);
  EXPECT_FALSE(parse({"--model", "llama-tiny", "--untie-embeddings"}).model.cfg.tiedEmbeddings);
  EXPECT_TRUE(parse({"--tie-embeddings"}).model.cfg.tiedEmbeddings);
  EXPECT_TRUE(parse({"--sp", "--sp=off", "--sp"}).parallel.sequenceParallel);  // the last wins
  const auto e = refusal({"--sp=maybe"});
  EXPECT_NE(e.find("--sp"), std::string::npos) << e;
  EXPECT_NE(e.find("'maybe'"), std::string::npos) << e;
  EXPECT_NE(refusal({"--sp", "1"}).find("unexpected argument '1'"), std::string::npos);
}

TEST(ConfigTest, Fp8RecipeAndSkippedBlocks) {
  auto o = parse({"--fp8", "rowwise", "--fp8-skip-blocks", "0,-1"});
  EXPECT_EQ(o.precision.fp8, tessera::fp8::Recipe::Rowwise);
  EXPECT_EQ(o.precision.fp8SkipBlocks, (std::vector<int>{0, -1}));
  EXPECT_NE(refusal({"--fp8", "blockwise"}).find("'blockwise'"), std::string::npos);
  EXPECT_NE(refusal({"--fp8-skip-blocks", "0"}).find("--fp8-skip-blocks needs --fp8"), std::string::npos);
  const auto range = refusal({"--fp8", "tensorwise", "--fp8-skip-blocks", "4"});  // tiny: blocks 0..3
  EXPECT_NE(range.find("--fp8-skip-blocks 4: the model has blocks 0..3"), std::string::npos) << range;
  // GPUs run the recipes on cuBLASLt's FP8 GEMMs (parallel/tensor/fp8_linear.h).
  EXPECT_EQ(parse({"--fp8", "tensorwise"}, /*onGpu=*/true).precision.fp8, tessera::fp8::Recipe::Tensorwise);
}

TEST(ConfigTest, ShapeFlagsMegatronNamesAndAliases) {
  const auto a =
      parse({"--model", "llama-tiny", "--hidden-size", "96", "--num-layers", "3", "--num-attention-heads", "6",
             "--num-query-groups", "3", "--ffn-hidden-size", "256", "--vocab-size", "512", "--seq-length", "48"});
  const auto b = parse({"--model", "llama-tiny", "--hidden-size=96", "--layers", "3", "--heads", "6", "--kv-heads", "3",
                        "--ffn", "256", "--vocab", "512", "--seq-len=48"});
  EXPECT_EQ(a.model.cfg.signature(), b.model.cfg.signature());
  EXPECT_EQ(a.model.cfg.d, 96);
  EXPECT_EQ(a.model.cfg.layers, 3);
  EXPECT_EQ(a.model.cfg.heads, 6);
  EXPECT_EQ(a.model.cfg.kvHeads, 3);
  EXPECT_EQ(a.model.cfg.ffn, 256);
  EXPECT_EQ(a.model.cfg.vocab, 512);
  EXPECT_EQ(a.model.cfg.seqLen, 48);
  // The families' attention: the preset's q/k norm and head size, overridden by --qk-norm, --kv-channels.
  const auto q = parse({"--model", "qwen3-30b-a3b", "--num-layers", "2"});
  EXPECT_EQ(q.model.cfg.qkNorm, tessera::models::QkNorm::PerHead);
  EXPECT_EQ(q.model.cfg.headDim(), 128);
  const auto o = parse({"--model", "llama-tiny", "--qk-norm", "whole", "--kv-channels", "32"});
  EXPECT_EQ(o.model.cfg.qkNorm, tessera::models::QkNorm::Whole);
  EXPECT_EQ(o.model.cfg.headDim(), 32);
  EXPECT_NE(refusal({"--model", "llama-tiny", "--qk-norm", "rms"}).find("'rms'"), std::string::npos);
  EXPECT_NE(refusal({"--model", "tiny", "--qk-norm", "per-head"}).find("needs the Llama block"), std::string::npos);
  // --d was ambiguous under torchrun 2.11; its refusal names the new flag.
  EXPECT_NE(refusal({"--d", "64"}).find("--hidden-size"), std::string::npos);
}

TEST_F(Options, FsdpPrefetchTakesMiBOrAuto) {
  EXPECT_EQ(parse({}).parallel.fsdpPrefetchMiB, -1);  // auto
  EXPECT_EQ(parse({"--fsdp-prefetch-mib", "auto"}).parallel.fsdpPrefetchMiB, -1);
  EXPECT_EQ(parse({"--fsdp-prefetch-mib", "0"}).parallel.fsdpPrefetchMiB, 0);
  EXPECT_EQ(parse({"--fsdp-prefetch-mib=2048"}).parallel.fsdpPrefetchMiB, 2048);
}

TEST_F(Options, DdpBucketTakesMiB) {
  EXPECT_EQ(parse({}).parallel.ddpBucketMiB, 25);
  EXPECT_EQ(parse({"--ddp-bucket-mib", "100"}).parallel.ddpBucketMiB, 100);
}

TEST_F(Options, GradReduceTakesFp32OrBf16) {
  EXPECT_FALSE(parse({}).parallel.gradReduceBf16);
  EXPECT_TRUE(parse({"--grad-reduce", "bf16"}).parallel.gradReduceBf16);
  EXPECT_FALSE(parse({"--grad-reduce=fp32"}).parallel.gradReduceBf16);
  EXPECT_FALSE(parse({}).parallel.zeroGrads);
  EXPECT_TRUE(parse({"--zero-grads", "zero"}).parallel.zeroGrads);
  EXPECT_FALSE(parse({"--zero-grads=mark"}).parallel.zeroGrads);
  EXPECT_FALSE(parse({}).precision.repeatKvHeads);
  EXPECT_TRUE(parse({"--gqa", "repeat"}).precision.repeatKvHeads);
  EXPECT_TRUE(parse({}).parallel.embGradGather);
  EXPECT_FALSE(parse({"--emb-grad", "reduce"}).parallel.embGradGather);
}

TEST_F(Options, SyncDebugOnGpusWithoutBreakdown) {
  EXPECT_EQ(parse({}, true).logging.syncDebug, tessera::SyncDebug::Off);
  EXPECT_EQ(parse({"--sync-debug", "error"}, true).logging.syncDebug, tessera::SyncDebug::Error);
  EXPECT_EQ(parse({"--sync-debug=warn", "--breakdown"}, true).logging.syncDebug, tessera::SyncDebug::Warn);
  EXPECT_NE(refusal({"--sync-debug", "error", "--breakdown"}, true).find("--breakdown"), std::string::npos);
  EXPECT_NE(refusal({"--sync-debug", "warn"}).find("GPU runs"), std::string::npos);
  const std::string e = refusal({"--sync-debug", "loud"}, true);
  EXPECT_NE(e.find("'loud'"), std::string::npos) << e;
  EXPECT_NE(e.find("off, warn or error"), std::string::npos) << e;
}

TEST_F(Options, BadValuesNameTheFlagAndTheValue) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--batch", "0"}, {"--batch", "'0'", ">= 1"}},
      {{"--batch", "-8"}, {"--batch", "'-8'"}},
      {{"--micro-batches", "0"}, {"--micro-batches", "'0'"}},
      {{"--checkpoint-every", "-1"}, {"--checkpoint-every", "'-1'", ">= 0"}},
      {{"--steps", "0"}, {"--steps", "'0'"}},
      {{"--lr", "-1e-3"}, {"--lr", "'-1e-3'", "> 0"}},
      {{"--lr", "fast"}, {"--lr", "'fast'"}},
      {{"--min-lr=-1"}, {"--min-lr", "'-1'"}},
      {{"--weight-decay", "-0.1"}, {"--weight-decay", "'-0.1'"}},
      {{"--hidden-size", "0"}, {"--hidden-size", "'0'"}},
      {{"--heads", "x"}, {"--num-attention-heads", "'x'"}},
      {{"--tp-forward-chunks", "65"}, {"--tp-forward-chunks", "'65'", "[1, 64]"}},
      {{"--sm-carveout", "2000"}, {"--sm-carveout", "'2000'"}},
      {{"--layout", "2x2"}, {"--layout", "'2x2'"}},
      {{"--layers-per-stage", "3,0"}, {"--layers-per-stage", "'3,0'"}},
      {{"--dp-mode", "zero"}, {"--dp-mode", "'zero'", "ddp, fsdp"}},
      {{"--schedule", "zb"}, {"--schedule", "'zb'", "1f1b, gpipe, interleaved"}},
      {{"--lr-schedule", "exp"}, {"--lr-schedule", "'exp'", "constant, cosine, linear, wsd"}},
      {{"--fused-kernels", "yes"}, {"--fused-kernels", "'yes'", "on, off, auto"}},
      {{"--fsdp-prefetch-mib", "-1"}, {"--fsdp-prefetch-mib", "'-1'", ">= 0"}},
      {{"--fsdp-prefetch-mib", "lots"}, {"--fsdp-prefetch-mib", "'lots'"}},
      {{"--ddp-bucket-mib", "0"}, {"--ddp-bucket-mib", "'0'", "[1, 4096]"}},
      {{"--grad-reduce", "fp16"}, {"--grad-reduce takes fp32 or bf16", "'fp16'"}},
      {{"--zero-grads", "none"}, {"--zero-grads takes mark or zero", "'none'"}},
      {{"--emb-grad", "sparse"}, {"--emb-grad takes gather or reduce", "'sparse'"}},
      {{"--gqa", "grouped"}, {"--gqa takes native or repeat", "'grouped'"}},
      {{"--model", "llama4"}, {"--model", "'llama4'", "llama3-1b"}},
      {{"--data", dir}, {"--data", "'" + dir + "'", "is a directory"}},
      {{"--data", "0.5 " + dir + " 0.5 x"}, {"--data", "is a directory"}},
      {{"--log-jsonl", dir}, {"--log-jsonl", "is a directory"}},
      {{"--precision", "bf16"}, {"--precision bf16", "GPUs"}},
      {{"--batch"}, {"--batch needs a value"}},
      {{"--bogus", "3"}, {"unknown flag '--bogus'"}},
      {{"--bogus=3"}, {"unknown flag '--bogus'"}},
      {{"--warmup", "9"}, {"warm-up of 9 steps in a run of 5"}},
  };
  for (const auto& [args, says] : cases) {
    const std::string e = refusal(args);
    ASSERT_FALSE(e.empty()) << "accepted: " << args.front();
    for (const auto& s : says) EXPECT_NE(e.find(s), std::string::npos) << "'" << e << "' lacks " << s;
  }
}

TEST(ConfigTest, LayoutErrorsAreUsageErrors) {
  auto o = parse({"--dp", "3"});
  EXPECT_THROW(o.resolve(4), UsageError);
  o = parse({"--batch", "6"});
  EXPECT_THROW(o.resolve(4), UsageError);
  // parse(flags).resolve(world) refuses with a message holding `text`.
  auto refusedLayout = [](std::vector<std::string> flags, int world, const std::string& text) {
    auto opts = parse(std::move(flags));
    try {
      opts.resolve(world);
      ADD_FAILURE() << "accepted; expected: " << text;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  refusedLayout({"--pp", "2", "--layers-per-stage", "3,3"}, 2, "--layers-per-stage 3,3");  // 6 of 4 layers
  refusedLayout({"--pp", "2", "--schedule", "zb-h1", "--dp-mode", "fsdp"}, 4,
                "--dp-mode fsdp with --schedule zb-h1 is not supported");
  o = parse({"--pp", "2", "--schedule", "zb-h1"});
  EXPECT_NO_THROW(o.resolve(4));  // DDP over dp 2
  EXPECT_EQ(o.parallel.dp, 2);
  EXPECT_EQ(o.parallel.schedule, tessera::pipeline::ScheduleKind::ZeroBubbleH1);
  refusedLayout({"--cp", "3"}, 3, "sequence length 32 is not divisible by 2 x cp = 6");  // T 32: not 2 x 3 chunks
  refusedLayout({"--cp", "2", "--tp", "3", "--sp"}, 6, "each cp rank's 16 positions are not divisible by tp = 3");
  // Expert parallel: an MoE model, ep dividing the dp x cp ranks and the experts.
  refusedLayout({"--ep", "2"}, 2, "--ep 2 needs a mixture-of-experts model");
  refusedLayout({"--model", "moe-tiny", "--ep", "3"}, 4, "--ep 3 must divide the data-parallel ranks dp 4 = 4");
  refusedLayout({"--model", "moe-tiny", "--ep", "2", "--tp", "2"}, 2, "--ep 2 must divide the data-parallel ranks dp 1");
  refusedLayout({"--model", "moe-tiny", "--ep", "3", "--num-experts", "8"}, 3, "--ep 3 does not divide the 8 experts");
  refusedLayout({"--moe-force-balanced"}, 1, "--moe-force-balanced needs a mixture-of-experts model");
  refusedLayout({"--fp8", "tensorwise", "--fp8-experts"}, 1, "--fp8-experts needs a mixture-of-experts model");
  refusedLayout({"--model", "moe-tiny", "--fp8-experts"}, 1, "--fp8-experts needs --fp8");
  refusedLayout({"--fsdp-keep-gathered", "on"}, 2, "--fsdp-keep-gathered on needs --dp-mode fsdp");
  refusedLayout({"--fsdp-accumulate", "sharded"}, 2, "--fsdp-accumulate sharded needs --dp-mode fsdp");
  for (const char* f : {"--fsdp-keep-gathered", "--fsdp-accumulate"}) {
    try {
      parse({f, "sometimes"});
      ADD_FAILURE() << f << " sometimes: accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(f) + ": unknown value 'sometimes'"), std::string::npos)
          << e.what();
    }
  }
  o = parse({"--dp-mode", "fsdp", "--fsdp-keep-gathered", "off", "--fsdp-accumulate", "sharded"});
  EXPECT_NO_THROW(o.resolve(2));
  EXPECT_EQ(o.parallel.fsdpKeepGathered, OnOffAuto::Off);
  EXPECT_EQ(o.parallel.fsdpAccumulate, FsdpAccumulate::Sharded);
  EXPECT_EQ(parse({}).parallel.fsdpAccumulate, FsdpAccumulate::Auto);
  o = parse({"--model", "moe-tiny", "--moe-force-balanced"});
  EXPECT_NO_THROW(o.resolve(1));
  EXPECT_TRUE(o.model.moeForceBalanced);
  o = parse({"--model", "moe-tiny", "--fp8", "tensorwise", "--fp8-experts"});
  EXPECT_NO_THROW(o.resolve(1));
  EXPECT_TRUE(o.precision.fp8Experts);
  EXPECT_FALSE(parse({"--model", "moe-tiny", "--fp8", "tensorwise"}).precision.fp8Experts);
  o = parse({"--model", "moe-tiny", "--ep", "4", "--cp", "2"});
  EXPECT_NO_THROW(o.resolve(8));  // the ep group spans dp 4 x cp 2
  EXPECT_EQ(o.parallel.ep, 4);
  o = parse({"--layout", "2x1x2x2"});
  EXPECT_NO_THROW(o.resolve(8));
  EXPECT_EQ(o.parallel.dp, 2);
  EXPECT_EQ(o.parallel.cp, 2);
  EXPECT_EQ(o.parallel.tp, 2);
  o = parse({"--cp", "2", "--tp", "2"});
  EXPECT_NO_THROW(o.resolve(8));
  EXPECT_EQ(o.parallel.dp, 2) << "dp = world / (pp x cp x tp)";
  EXPECT_THROW(parse({"--layout", "2x2"}), UsageError);
  o = parse({"--heads", "8", "--tp", "2"});
  EXPECT_NO_THROW(o.resolve(4));
  EXPECT_EQ(o.parallel.dp, 2);
  EXPECT_EQ(o.optim.batch, 16);
  EXPECT_FALSE(o.optim.batchGiven);  // filled in, not given
}

TEST(ConfigTest, HelpListsEveryFlagWithItsDefault) {
  EXPECT_TRUE(parse({"--batch", "8", "--help"}).help);
  const std::string cpu = usage(Machine{false}), gpu = usage(Machine{true});
  for (const char* f : {"--hidden-size", "--num-layers,--layers", "--num-attention-heads,--heads", "--config FILE",
                        "--seq-length,--seq-len", "--vocab-size,--vocab", "--peak-tflops"}) {
    EXPECT_NE(cpu.find(f), std::string::npos) << f;
  }
  EXPECT_NE(cpu.find("model preset (listed below) [tiny]"), std::string::npos);
  EXPECT_NE(gpu.find("model preset (listed below) [735m]"), std::string::npos);
  EXPECT_NE(gpu.find("(0: no MFU) [989]"), std::string::npos);
  // The shape flags' default is the preset's, whatever --model says (issue 52: tiny's numbers were shown).
  EXPECT_NE(cpu.find("model width (divisible by the heads) [the preset's]"), std::string::npos);
  EXPECT_EQ(cpu.find("model width (divisible by the heads) [64]"), std::string::npos);
  for (const char* f : {"--nan-policy stop|skip-step", "--keep-last K", "--timeout S", "--print-config"}) {
    EXPECT_NE(cpu.find(f), std::string::npos) << f;
  }
}

}  // namespace
