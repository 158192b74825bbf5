#pragma once
// train_gpt's flags as one table: options.cpp builds the CLI11 parser, --help and configToml()
// from it, so parsing, help and the written config cannot drift apart. Internal to examples/gpt.
#include <functional>
#include <string>
#include <vector>

#include "options.h"

namespace tessera::gpt {

struct Flag {
  std::string names;  // CLI11's: the canonical long name first, then aliases ("--num-layers,--layers")
  std::string value;  // what follows the flag in --help ("N", "ddp|fsdp"); empty: a switch
  std::string help;   // one line
  std::string group;  // --help's section
  std::string shown;  // the default --help shows where get() of the defaults cannot say it ("8 * dp")
  // Applies a value (a switch's: "true", "off", "0", ...) to the options; UsageError naming the
  // flag and the value when it is not accepted.
  std::function<void(TrainOptions&, const std::string&)> set;
  // The options' value as a TOML value; empty: left out of the config (nothing to give, or
  // another flag carries it). Null: never in the config.
  std::function<std::string(const TrainOptions&)> get;

  std::string flag() const;  // the canonical name: "--num-layers"
  std::string key() const;   // its TOML key: "num-layers"
};

// Every flag, in the order their values apply (the preset before the dimensions that override
// it, --layout before --dp/--pp/--tp). `onGpu`: what "auto" means for --fused-kernels.
std::vector<Flag> flagTable(bool onGpu);

// A switch's value: "true" / "on" / "yes" / "1" or "false" / "off" / "no" / "0"; else UsageError.
bool switchValue(const std::string& flag, const std::string& v);

}  // namespace tessera::gpt
