#pragma once
// The flags of a training run as one table (internal): config.cpp builds the CLI11 parser,
// --help and Config::toToml() from it, so parsing, help and the written config cannot drift apart.
// Each flag sets one field of the Config; its value is checked (UsageError naming the flag).
#include <fmt/format.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tessera/train/config.h"

// USAGE_CHECK(cond, "fmt {}", args...): throws train::UsageError with the formatted message.
#define USAGE_CHECK(cond, ...)                                                \
  do {                                                                        \
    if (!(cond)) throw ::tessera::train::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)

namespace tessera::train {

struct Flag {
  std::string names;  // CLI11's: the canonical long name first, then aliases ("--num-layers,--layers")
  std::string value;  // what follows the flag in --help ("N", "ddp|fsdp"); empty: a switch
  std::string help;   // one line
  std::string group;  // --help's section
  std::string shown;  // the default --help shows where get() of the defaults cannot say it ("8 * dp")
  // Applies a value (a switch's: "true", "off", "0", ...) to the config; UsageError naming the
  // flag and the value when it is not accepted.
  std::function<void(Config&, const std::string&)> set;
  // The config's value as a TOML value; empty: left out of the file (nothing to give, or another
  // flag carries it). Null: never in the file.
  std::function<std::string(const Config&)> get;

  std::string flag() const;  // the canonical name: "--num-layers"
  std::string key() const;   // its TOML key: "num-layers"
};

// Every flag, in the order their values apply (the preset before the dimensions that override
// it, --layout before --dp/--pp/--tp). `gpu`: what "auto" means for --fused-kernels.
std::vector<Flag> flagTable(bool gpu);
// The mixture-of-experts flags (moe_flags.cpp), a group of flagTable().
std::vector<Flag> moeFlags();

// The checks across flags once every value is in (UsageError naming the flags); sets the LR
// schedule's total to the steps and chunks to 1 unless interleaved.
void checkConfig(Config& c, bool gpu);

// The global batch of the checkpoint a run in `checkpointDir` resumes (nullopt: none there, a
// weights-only one, or one saved before the batch was recorded). Error: a damaged checkpoint.
std::optional<int64_t> savedGlobalBatch(const std::string& checkpointDir);

// A switch's value: "true" / "on" / "yes" / "1" or "false" / "off" / "no" / "0"; else UsageError.
bool switchValue(const std::string& flag, const std::string& v);

}  // namespace tessera::train
