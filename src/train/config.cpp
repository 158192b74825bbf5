// A run's command line and --config file on CLI11 (Config::parse, usage); the flags themselves are
// flags.cpp's table, the checks across them checks.cpp's.
#include "tessera/train/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "train/flags.h"

namespace tessera::train {

Machine Machine::detect(Settings env) {
  const bool gpu = torch::cuda::is_available() && env.backend.value_or(Backend::Nccl) == Backend::Nccl;
  return {gpu, std::move(env)};
}
Machine Machine::detect() { return detect(Settings::fromEnvironment()); }

// The options before any flag: this machine's defaults (GPU or CPU) and the environment's.
Config Config::defaults(const Machine& m) {
  const bool onGpu = m.gpu;
  const Settings& env = m.env;
  Config o;
  o.parallel.overlap = tp::LinearOverlap::fromSettings(env);
  o.logging.profile = env.profile;
  o.logging.profileCpu = env.profileCpu;
  o.model.preset = onGpu ? "735m" : "tiny";
  o.model.cfg = models::presetConfig(o.model.preset);
  o.precision.precision = onGpu ? Precision::Bf16 : Precision::Fp32;
  o.precision.fusedKernels = onGpu;  // auto: the CUDA kernels on GPUs; CPU runs keep ATen's ops
  o.logging.peakTflops = onGpu ? 989 : 0;
  return o;
}

namespace {
namespace fs = std::filesystem;

std::string footer() {
  std::string presets;
  for (const auto& name : models::presetNames()) {
    presets += fmt::format("  {:<11} {}\n", name, models::presetConfig(name).describe());
  }
  return "Switches: --name, or --name=on|off (true|false, yes|no, 1|0). Given twice, the last value wins.\n"
         "--config FILE: `name = value` lines (TOML, strings quoted) naming any flag above without its dashes;\n"
         "flags on the command line win. Rank 0 prints the run's resolved config in this form at the start.\n"
         "GPU defaults (a CUDA device visible, TESSERA_BACKEND unset): model 735m, bf16, fused kernels, MFU of\n"
         "989 TFLOP/s per GPU; CPU: tiny, fp32, no MFU.\n"
         "--data PATH: a Megatron dataset (PREFIX of PREFIX.bin/.idx), llm.c shards (a glob) or a raw token\n"
         "file (with --data-format raw-uint16|raw-uint32); a blend weighs several (Megatron's syntax).\n"
         "Model presets (any dimension can follow):\n" +
         presets;
}

// CLI11's parser over the flag table: options[i] parses flags[i].
struct Cli {
  CLI::App app{"train_gpt: a GPT or Llama trained in any dp x pp x tp layout (docs/training.md)", "train_gpt"};
  std::vector<Flag> flags;
  std::vector<CLI::Option*> options;
  CLI::Option* config = nullptr;
};

std::unique_ptr<Cli> makeCli(bool onGpu, const Settings& env) {
  auto cli = std::make_unique<Cli>();
  auto& app = cli->app;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();  // parseOptions names the first one
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.get_formatter()->column_width(40);
  app.get_help_ptr()->group("General");
  cli->config = app.set_config("--config", "", "TOML file of flags, `name = value` a line (flags given here win)");
  cli->config->type_name("FILE")->group("General");
  const Config dflt = Config::defaults({onGpu, env});
  cli->flags = flagTable(onGpu);
  for (const auto& f : cli->flags) {
    std::string shown = f.shown;
    if (shown.empty() && f.get) {
      shown = f.get(dflt);
      if (f.value.empty() && !shown.empty()) shown = shown == "true" ? "on" : "off";
    }
    if (shown.size() >= 2 && (shown.front() == '"' || shown.front() == '\'')) shown = shown.substr(1, shown.size() - 2);
    const std::string help =
        f.help + (f.get || !f.shown.empty() ? fmt::format(" [{}]", shown.empty() ? "none" : shown) : "");
    CLI::Option* opt = f.value.empty() ? app.add_flag(f.names, help) : app.add_option(f.names, help);
    if (!f.value.empty()) opt->type_name(f.value);
    opt->group(f.group);
    cli->options.push_back(opt);
  }
  app.footer(footer());
  return cli;
}

// CLI11's error as train_gpt's, naming the flag or the config file.
std::string message(const Cli& cli, const CLI::ParseError& e) {
  const std::string file = cli.config->empty() ? "" : cli.config->results().back();
  const std::string what = e.what();
  if (e.get_name() == "FileError") {
    std::error_code ec;
    if (fs::is_directory(file, ec)) {
      return fmt::format("train_gpt: --config '{}' is a directory, not a TOML file", file);
    }
    return fmt::format("train_gpt: --config '{}': cannot read it (missing?)", file);
  }
  if (e.get_name() == "ConfigError") {
    if (const auto at = what.rfind(' '); what.rfind("INI was not able to parse", 0) == 0 && at != std::string::npos) {
      return fmt::format(
          "train_gpt: --config '{}': unknown key '{}' (keys are the flags' long names without "
          "dashes; train_gpt --help lists them)",
          file, what.substr(at + 1));
    }
    return fmt::format("train_gpt: --config '{}': {}", file, what);
  }
  if (e.get_name() == "ArgumentMismatch" && what.size() > 7 && what.compare(what.size() - 7, 7, "missing") == 0) {
    return fmt::format("train_gpt: {} needs a value",
                       what.substr(0, what.find(": ")));  // "--batch: 1 required B missing"
  }
  return fmt::format("train_gpt: {} (train_gpt --help lists the flags)", what);
}

// Whether `f` is among the arguments themselves (not only in the --config file): "--name", "--name=v".
bool onCommandLine(const Flag& f, const std::vector<std::string>& argv) {
  std::stringstream names(f.names);
  for (std::string n; std::getline(names, n, ',');) {
    for (const auto& a : argv) {
      if (a == n || a.rfind(n + "=", 0) == 0) return true;
    }
  }
  return false;
}

// The parsed values into `o`: the saved model and batch a run resumes (or starts from), the --config
// file's values, then the command line's.
void fill(const Cli& cli, const std::vector<std::string>& argv, Config& o) {
  // Without --model: the model of --init-from-hf's directory or of the checkpoint (the shape flags
  // below still apply).
  auto given = [&](const std::string& flag) -> std::optional<std::string> {
    for (size_t i = 0; i < cli.flags.size(); ++i) {
      if (cli.flags[i].flag() == flag && cli.options[i]->count() > 0) return cli.options[i]->results().back();
    }
    return std::nullopt;
  };
  if (!given("--model")) {
    const auto hf = given("--init-from-hf").value_or(""), ckpt = given("--checkpoint-dir").value_or("");
    try {
      if (auto saved = savedModelConfig(hf, ckpt)) {
        o.model.cfg = *saved;
        o.model.preset = hf.empty() ? "checkpoint" : "hf";
      }
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(fmt::format("train_gpt: {}", e.what()));
    }
  }
  // The --config file's values first, then the command line's: a flag given here wins over every
  // key of the file it overlaps (--layout over the file's dp, pp, cp and tp).
  for (const bool commandLine : {false, true}) {
    for (size_t i = 0; i < cli.flags.size(); ++i) {
      if (cli.options[i]->count() > 0 && onCommandLine(cli.flags[i], argv) == commandLine) {
        cli.flags[i].set(o, cli.options[i]->results().back());
      }
    }
  }
  // A layout changed on the command line over a file's: dp follows the world again unless given.
  auto here = [&](const char* name) {
    for (const auto& f : cli.flags)
      if (f.flag() == name) return onCommandLine(f, argv);
    return false;
  };
  if (!cli.config->empty() && !here("--dp") && !here("--layout") && (here("--pp") || here("--tp") || here("--cp"))) {
    o.parallel.dp = 0;
  }
  // Without --batch: a resumed run keeps its checkpoint's global batch (said by the trainer).
  if (!given("--batch")) {
    try {
      if (const auto b = savedGlobalBatch(given("--checkpoint-dir").value_or(""))) {
        o.optim.batch = *b;
        o.optim.batchFromCheckpoint = true;
      }
    } catch (const Error& e) {
      throw UsageError(fmt::format("train_gpt: {}", e.what()));
    }
  }
}

}  // namespace

std::string usage(const Machine& m) { return makeCli(m.gpu, m.env)->app.help(); }

Config Config::parse(int argc, char** argv, const Machine& m) {
  return parse(std::vector<std::string>(argv + std::min(argc, 1), argv + argc), m);
}

Config Config::fromToml(const std::string& path, const Machine& m) { return parse({"--config", path}, m); }

Config Config::parse(const std::vector<std::string>& argv, const Machine& m) {
  auto cli = makeCli(m.gpu, m.env);
  Config o = defaults(m);
  // CLI11 reads "--name=" as "--name" and takes the next argument; here: the empty value.
  std::vector<std::string> args;  // reversed, as CLI11 takes them
  for (auto it = argv.rbegin(); it != argv.rend(); ++it) {
    const std::string& a = *it;
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.back() == '=') {
      args.push_back("");
      args.push_back(a.substr(0, a.size() - 1));
    } else {
      args.push_back(a);
    }
  }
  try {
    cli->app.parse(args);
  } catch (const CLI::CallForHelp&) {
    o.help = true;
    return o;
  } catch (const CLI::ParseError& e) {
    throw UsageError(message(*cli, e));
  }
  if (const auto extra = cli->app.remaining(); !extra.empty()) {
    const std::string& a = extra.front();
    const std::string name = a.substr(0, a.find('='));
    USAGE_CHECK(name != "--d",
                "train_gpt: unknown flag '--d': the width is --hidden-size (torchrun 2.x would take --d "
                "for an abbreviation of its --duplicate-* options)");
    USAGE_CHECK(a.rfind('-', 0) != 0, "train_gpt: unknown flag '{}' (train_gpt --help lists the flags)", name);
    throw UsageError(
        fmt::format("train_gpt: unexpected argument '{}' (flags are --name VALUE or --name=VALUE; "
                    "switches take no value, or --name=on|off)",
                    a));
  }
  fill(*cli, argv, o);
  checkConfig(o, m.gpu);
  return o;
}

}  // namespace tessera::train
