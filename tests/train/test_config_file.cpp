// train_gpt's --config (src/train/config.h): a TOML file under the flags, its errors naming
// the key or the file, and the resolved config read back into equal options.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_test_util.h"
#include "tessera/train/config.h"

namespace {
using namespace tessera::train;
using namespace tessera::train::config_test;

TEST_F(Options, ConfigFileUnderTheFlags) {
  const auto file = write("run.toml",
                          "# a run\nsteps = 3\nbatch = 8\nsp = true\ndata-format = \"megatron\"\n"
                          "layers-per-stage = \"3,1\"\nnum-layers = 4\npp = 2\n");
  const auto o = parse({"--config", file, "--steps", "4", "--sp=off"});
  EXPECT_EQ(o.optim.steps, 4);  // the command line wins
  EXPECT_EQ(o.optim.batch, 8);
  EXPECT_TRUE(o.optim.batchGiven);
  EXPECT_FALSE(o.parallel.sequenceParallel);
  EXPECT_EQ(o.data.format, tessera::data::Format::Megatron);
  EXPECT_EQ(o.parallel.layersPerStage, (std::vector<int>{3, 1}));
  EXPECT_FALSE(parse({"--config", write("b.toml", "steps = 3\n")}).optim.batchGiven);
  EXPECT_FALSE(parse({}).optim.batchGiven);
  EXPECT_TRUE(parse({"--batch", "16"}).optim.batchGiven);

  std::string e = refusal({"--config", write("bad.toml", "stesp = 3\n")});
  EXPECT_NE(e.find("unknown key 'stesp'"), std::string::npos) << e;
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  e = refusal({"--config", write("neg.toml", "batch = -8\n")});
  EXPECT_NE(e.find("--batch expects an integer >= 1, got '-8'"), std::string::npos) << e;
  e = refusal({"--config", dir});
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  e = refusal({"--config", dir + "/missing.toml"});
  EXPECT_NE(e.find("missing.toml"), std::string::npos) << e;
}

// Every flag given on the command line wins over the file, also one that sets several of its keys:
// --layout over the file's dp, pp and tp (issue 52: it was silently ignored); --pp/--tp alone give
// dp back to the world.
TEST_F(Options, LayoutFlagsBesideAConfigFileWin) {
  const auto file = write("saved.toml", "dp = 1\npp = 2\ntp = 2\nmicro-batches = 4\nbatch = 16\n");
  auto o = parse({"--config", file});
  EXPECT_EQ(std::vector<int>({o.parallel.dp, o.parallel.pp, o.parallel.tp}), std::vector<int>({1, 2, 2}));
  o = parse({"--config", file, "--layout", "4x1x1"});
  EXPECT_EQ(std::vector<int>({o.parallel.dp, o.parallel.pp, o.parallel.tp}), std::vector<int>({4, 1, 1}));
  o.resolve(4);
  EXPECT_EQ(o.parallel.dp, 4);
  o = parse({"--config", file, "--pp", "1", "--tp", "1"});
  EXPECT_EQ(o.parallel.dp, 0);  // auto: the world's
  o.resolve(2);
  EXPECT_EQ(std::vector<int>({o.parallel.dp, o.parallel.pp, o.parallel.tp}), std::vector<int>({2, 1, 1}));
  o = parse({"--config", file, "--dp", "2", "--pp", "1"});
  EXPECT_EQ(std::vector<int>({o.parallel.dp, o.parallel.pp, o.parallel.tp}), std::vector<int>({2, 1, 2}));
  // The new keys of issue 52 read back.
  o = parse({"--nan-policy", "skip-step", "--keep-last", "5", "--timeout", "30"});
  const auto back = parse({"--config", write("new.toml", o.toToml())});
  EXPECT_EQ(back.optim.nanPolicy, NanPolicy::SkipStep);
  EXPECT_EQ(back.checkpoint.keepLast, 5);
  EXPECT_EQ(back.timeoutS, 30);
  EXPECT_EQ(o.toToml().find("print-config"), std::string::npos);
  const std::string e = refusal({"--nan-policy", "ignore"});
  EXPECT_NE(e.find("--nan-policy: unknown nan policy 'ignore'; allowed: stop, skip-step"), std::string::npos) << e;
}

// Resolved options → toToml → --config → resolved again: the same options, every field that
// has a flag included (the TOML says them all) and the model's whole shape.
TEST_F(Options, ResolvedConfigReadsBackIntoEqualOptions) {
  struct Run {
    std::vector<std::string> args;
    int world;
    bool onGpu;
  };
  const std::vector<Run> runs = {
      {{}, 1, false},
      {{"--model",
        "llama-tiny",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "2",
        "--layers-per-stage",
        "3,1",
        "--schedule",
        "gpipe",
        "--data",
        "0.7 a/b_text_document 0.3 'c'",
        "--split",
        "98,2",
        "--lr",
        "3e-3",
        "--min-lr",
        "3e-4",
        "--lr-schedule",
        "wsd",
        "--warmup",
        "1",
        "--decay-steps",
        "2",
        "--clip",
        "0.3",
        "--seed",
        "7",
        "--eod-token",
        "2",
        "--log-jsonl",
        "",
        "--untie-embeddings",
        "--no-decay-embeddings",
        "--recompute",
        "selective",
        "--tp-ring",
        "--profile",
        "p.json:1:1",
        "--rope-theta",
        "123.456",
        "--weight-decay",
        "0.125"},
       8,
       false},
      {{"--layout", "1x2x1", "--schedule", "interleaved", "--chunks", "2", "--micro-batches", "4", "--batch", "12",
        "--dp-mode", "ddp", "--checkpoint-dir", "ckpt", "--checkpoint-every", "2", "--fused-kernels", "on"},
       2,
       false},
      {{"--model", "llama3-1b", "--vocab-size", "32000", "--tp", "4", "--peak-tflops", "0", "--breakdown",
        "--sync-debug", "warn"},
       8,
       true},
  };
  for (const auto& r : runs) {
    auto first = parse(r.args, r.onGpu);
    first.resolve(r.world);
    const std::string toml = first.toToml();
    auto again = parse({"--config", write("resolved.toml", toml)}, r.onGpu);
    again.resolve(r.world);
    EXPECT_EQ(again.toToml(), toml);
    EXPECT_EQ(again.describe(), first.describe());
    EXPECT_EQ(again.model.cfg.signature(), first.model.cfg.signature());
    EXPECT_EQ(again.model.cfg.describe(), first.model.cfg.describe());
    EXPECT_EQ(again.data.data, first.data.data);
    EXPECT_EQ(again.parallel.layersPerStage, first.parallel.layersPerStage);
    EXPECT_EQ(again.logging.jsonl, first.logging.jsonl);
    EXPECT_EQ(again.logging.peakTflops, first.logging.peakTflops);
    EXPECT_TRUE(again.optim.batchGiven);  // the resolved config gives the batch
  }
}

}  // namespace
