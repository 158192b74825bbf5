// train_gpt's --config (examples/gpt/options.h): a TOML file under the flags, its errors naming
// the key or the file, and the resolved config read back into equal options.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpt/options.h"
#include "options_test_util.h"

namespace {
using namespace tessera::gpt;
using namespace tessera::gpt::options_test;

TEST_F(Options, ConfigFileUnderTheFlags) {
  const auto file = write("run.toml",
                          "# a run\nsteps = 3\nbatch = 8\nsp = true\ndata-format = \"megatron\"\n"
                          "layers-per-stage = \"3,1\"\nnum-layers = 4\npp = 2\n");
  const auto o = parse({"--config", file, "--steps", "4", "--sp=off"});
  EXPECT_EQ(o.steps, 4);  // the command line wins
  EXPECT_EQ(o.batch, 8);
  EXPECT_TRUE(o.batchGiven);
  EXPECT_FALSE(o.sequenceParallel);
  EXPECT_EQ(o.dataFormat, tessera::data::Format::Megatron);
  EXPECT_EQ(o.layersPerStage, (std::vector<int>{3, 1}));
  EXPECT_FALSE(parse({"--config", write("b.toml", "steps = 3\n")}).batchGiven);
  EXPECT_FALSE(parse({}).batchGiven);
  EXPECT_TRUE(parse({"--batch", "16"}).batchGiven);

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

// Resolved options → configToml → --config → resolved again: the same options, every field that
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
    resolveLayout(first, r.world);
    const std::string toml = configToml(first);
    auto again = parse({"--config", write("resolved.toml", toml)}, r.onGpu);
    resolveLayout(again, r.world);
    EXPECT_EQ(configToml(again), toml);
    EXPECT_EQ(describe(again), describe(first));
    EXPECT_EQ(again.cfg.signature(), first.cfg.signature());
    EXPECT_EQ(again.cfg.describe(), first.cfg.describe());
    EXPECT_EQ(again.data, first.data);
    EXPECT_EQ(again.layersPerStage, first.layersPerStage);
    EXPECT_EQ(again.logJsonl, first.logJsonl);
    EXPECT_EQ(again.peakTflops, first.peakTflops);
    EXPECT_TRUE(again.batchGiven);  // the resolved config gives the batch
  }
}

}  // namespace
