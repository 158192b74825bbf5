// train_gpt's command line on CLI11; the flags themselves are options_flags.cpp's table.
#include "options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <optional>
#include <memory>
#include <sstream>

#include "options_flags.h"

namespace tessera::gpt {

namespace {
namespace fs = std::filesystem;

// The options before any flag: this machine's defaults (GPU or CPU) and the environment's.
TrainOptions defaults(bool onGpu, const Settings& env) {
  TrainOptions o;
  o.overlap = tp::LinearOverlap::fromSettings(env);
  o.profile = env.profile;
  o.profileCpu = env.profileCpu;
  o.model = onGpu ? "735m" : "tiny";
  o.cfg = models::presetConfig(o.model);
  o.precision = onGpu ? Precision::Bf16 : Precision::Fp32;
  o.fusedKernels = onGpu;  // auto: the CUDA kernels on GPUs; CPU runs keep ATen's ops
  o.peakTflops = onGpu ? 989 : 0;
  return o;
}

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
  const TrainOptions dflt = defaults(onGpu, env);
  cli->flags = flagTable(onGpu);
  for (const auto& f : cli->flags) {
    std::string shown = f.shown;
    if (shown.empty() && f.get) shown = f.get(dflt);
    if (f.value.empty() && !shown.empty()) shown = shown == "true" ? "on" : "off";
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
    return fmt::format("train_gpt: {} needs a value", what.substr(0, what.find(": ")));  // "--batch: 1 required B missing"
  }
  return fmt::format("train_gpt: {} (train_gpt --help lists the flags)", what);
}

// A directory where data, a log file or a checkpoint directory is expected: said now, by name.
void checkPaths(const TrainOptions& o) {
  std::error_code ec;
  auto data = [&](const char* flag, const std::string& spec) {
    std::istringstream words(spec);
    for (std::string w; words >> w;) {
      USAGE_CHECK(!fs::is_directory(w, ec) || fs::exists(w + ".idx", ec),
                  "train_gpt: {} '{}' is a directory; expected a Megatron PREFIX (of PREFIX.bin and PREFIX.idx), "
                  "llm.c shards (a glob such as '{}/*.bin') or a token file",
                  flag, w, w);
    }
  };
  if (o.data != "synthetic") data("--data", o.data);
  data("--valid-data", o.validData);
  USAGE_CHECK(o.logJsonl.empty() || !fs::is_directory(o.logJsonl, ec),
              "train_gpt: --log-jsonl '{}' is a directory; expected a file name", o.logJsonl);
  USAGE_CHECK(o.checkpointDir.empty() || !fs::exists(o.checkpointDir, ec) || fs::is_directory(o.checkpointDir, ec),
              "train_gpt: --checkpoint-dir '{}' is a file; expected a directory", o.checkpointDir);
}

// The checks across flags, once every value is in.
void check(TrainOptions& o, bool onGpu) {
  USAGE_CHECK(o.precision == Precision::Fp32 || onGpu, "train_gpt: --precision bf16 needs GPUs (CPU runs are fp32)");
  USAGE_CHECK(o.extraWarmup == 0 || o.schedule == pipeline::ScheduleKind::OneFOneB,
              "train_gpt: --extra-warmup {} needs --schedule 1f1b (schedule: {})", o.extraWarmup,
              pipeline::scheduleName(o.schedule));
  USAGE_CHECK(o.evalEvery == 0 || o.data != "synthetic",
              "train_gpt: --eval-every needs validation data (--data PATH with --split or --valid-data)");
  USAGE_CHECK(!o.data.empty(), "train_gpt: --data needs 'synthetic' or a dataset");
  USAGE_CHECK(o.data != "synthetic" || o.validData.empty(),
              "train_gpt: --valid-data needs --data PATH (not synthetic)");
  checkPaths(o);
  USAGE_CHECK(o.saveHfEvery == 0 || !o.saveHfDir.empty(),
              "train_gpt: --save-hf-every {} needs --save-hf-dir DIR (each export goes to DIR/step-<s>)", o.saveHfEvery);
  USAGE_CHECK((o.saveHfEvery == 0 && o.saveHfAtEnd.empty() && o.initFromHf.empty()) || o.cfg.arch == models::Arch::Llama,
              "train_gpt: --init-from-hf and --save-hf-* take a Llama (--model llama-*), not {}", o.cfg.describe());
  USAGE_CHECK(o.fp8SkipBlocks.empty() || o.fp8 != fp8::Recipe::Off, "train_gpt: --fp8-skip-blocks needs --fp8");
  USAGE_CHECK(o.syncDebug != SyncDebug::Error || !o.breakdown,
              "train_gpt: --sync-debug error cannot go with --breakdown, whose timings synchronize the device");
  USAGE_CHECK(o.syncDebug == SyncDebug::Off || onGpu, "train_gpt: --sync-debug checks GPU runs (a CPU run has no device to wait for)");
  for (const int b : o.fp8SkipBlocks)
    USAGE_CHECK(b >= -o.cfg.layers && b < o.cfg.layers,
                "train_gpt: --fp8-skip-blocks {}: the model has blocks 0..{} (or -{}..-1 from the end)", b,
                o.cfg.layers - 1, o.cfg.layers);
  o.lr.total = o.steps;
  try {
    models::validate(o.cfg);
    optim::validate(o.lr);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(fmt::format("train_gpt: {}", e.what()));
  }
  if (o.schedule != pipeline::ScheduleKind::Interleaved1F1B) o.chunks = 1;
}
}  // namespace

std::string usage(bool onGpu, const Settings& env) { return makeCli(onGpu, env)->app.help(); }

TrainOptions parseOptions(int argc, char** argv, bool onGpu, const Settings& env) {
  auto cli = makeCli(onGpu, env);
  TrainOptions o = defaults(onGpu, env);
  // CLI11 reads "--name=" as "--name" and takes the next argument; train_gpt: the empty value.
  std::vector<std::string> args;  // reversed, as CLI11 takes them
  for (int i = argc - 1; i >= 1; --i) {
    const std::string a = argv[i];
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
    o.model = "help";
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
  // Without --model: the model of --init-from-hf's directory or of the checkpoint (the shape flags
  // below still apply).
  auto given = [&](const std::string& flag) -> std::optional<std::string> {
    for (size_t i = 0; i < cli->flags.size(); ++i) {
      if (cli->flags[i].flag() == flag && cli->options[i]->count() > 0) return cli->options[i]->results().back();
    }
    return std::nullopt;
  };
  if (!given("--model")) {
    const auto hf = given("--init-from-hf").value_or(""), ckpt = given("--checkpoint-dir").value_or("");
    try {
      if (auto saved = savedModelConfig(hf, ckpt)) {
        o.cfg = *saved;
        o.model = hf.empty() ? "checkpoint" : "hf";
      }
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(fmt::format("train_gpt: {}", e.what()));
    }
  }
  for (size_t i = 0; i < cli->flags.size(); ++i) {
    if (cli->options[i]->count() > 0) cli->flags[i].set(o, cli->options[i]->results().back());
  }
  check(o, onGpu);
  return o;
}

}  // namespace tessera::gpt
