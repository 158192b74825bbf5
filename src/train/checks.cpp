// The checks across a run's flags once every value is in (checkConfig, flags.h): what cannot run
// together, paths of the wrong kind, the model's shape and the LR schedule.
#include <fmt/format.h>

#include <filesystem>
#include <sstream>

#include "hf/families.h"
#include "tessera/train/model_spec.h"
#include "train/flags.h"

namespace tessera::train {

namespace {
namespace fs = std::filesystem;

// A directory where data, a log file or a checkpoint directory is expected: said now, by name.
void checkPaths(const Config& o) {
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
  if (o.data.data != "synthetic") data("--data", o.data.data);
  data("--valid-data", o.data.validData);
  USAGE_CHECK(o.logging.jsonl.empty() || !fs::is_directory(o.logging.jsonl, ec),
              "train_gpt: --log-jsonl '{}' is a directory; expected a file name", o.logging.jsonl);
  USAGE_CHECK(o.checkpoint.dir.empty() || !fs::exists(o.checkpoint.dir, ec) || fs::is_directory(o.checkpoint.dir, ec),
              "train_gpt: --checkpoint-dir '{}' is a file; expected a directory", o.checkpoint.dir);
}

// Why the model cannot be exported to Hugging Face (hf::familyOf's refusal), or empty.
std::string hfRefusal(const models::ModelConfig& c) {
  try {
    hf::familyOf(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

void checkConfig(Config& o, bool onGpu) {
  USAGE_CHECK(o.precision.precision == Precision::Fp32 || onGpu,
              "train_gpt: --precision bf16 needs GPUs (CPU runs are fp32)");
  USAGE_CHECK(o.parallel.extraWarmup == 0 || o.parallel.schedule == pipeline::ScheduleKind::OneFOneB,
              "train_gpt: --extra-warmup {} needs --schedule 1f1b (schedule: {})", o.parallel.extraWarmup,
              pipeline::scheduleName(o.parallel.schedule));
  USAGE_CHECK(o.data.evalEvery == 0 || o.data.data != "synthetic",
              "train_gpt: --eval-every needs validation data (--data PATH with --split or --valid-data)");
  USAGE_CHECK(!o.data.data.empty(), "train_gpt: --data needs 'synthetic' or a dataset");
  USAGE_CHECK(o.data.data != "synthetic" || o.data.validData.empty(),
              "train_gpt: --valid-data needs --data PATH (not synthetic)");
  checkPaths(o);
  USAGE_CHECK(o.checkpoint.saveHfEvery == 0 || !o.checkpoint.saveHfDir.empty(),
              "train_gpt: --save-hf-every {} needs --save-hf-dir DIR (each export goes to DIR/step-<s>)",
              o.checkpoint.saveHfEvery);
  const bool hf = o.checkpoint.saveHfEvery > 0 || !o.checkpoint.saveHfAtEnd.empty() || !o.checkpoint.initFromHf.empty();
  USAGE_CHECK(!hf || modelSpec(o.model.cfg.arch).huggingFace,
              "train_gpt: --init-from-hf and --save-hf-* take a Llama (--model llama-*), not {}",
              o.model.cfg.describe());
  const bool saveHf = o.checkpoint.saveHfEvery > 0 || !o.checkpoint.saveHfAtEnd.empty();
  USAGE_CHECK(!saveHf || hfRefusal(o.model.cfg).empty(), "train_gpt: --save-hf-* cannot export this model: {}",
              hfRefusal(o.model.cfg));
  USAGE_CHECK(o.precision.fp8SkipBlocks.empty() || o.precision.fp8 != fp8::Recipe::Off,
              "train_gpt: --fp8-skip-blocks needs --fp8");
  USAGE_CHECK(o.logging.syncDebug != SyncDebug::Error || !o.logging.breakdown,
              "train_gpt: --sync-debug error cannot go with --breakdown, whose timings synchronize the device");
  USAGE_CHECK(o.logging.syncDebug == SyncDebug::Off || onGpu,
              "train_gpt: --sync-debug checks GPU runs (a CPU run has no device to wait for)");
  for (const int b : o.precision.fp8SkipBlocks)
    USAGE_CHECK(b >= -o.model.cfg.layers && b < o.model.cfg.layers,
                "train_gpt: --fp8-skip-blocks {}: the model has blocks 0..{} (or -{}..-1 from the end)", b,
                o.model.cfg.layers - 1, o.model.cfg.layers);
  o.optim.lr.total = o.optim.steps;
  try {
    models::validate(o.model.cfg);
    optim::validate(o.optim.lr);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(fmt::format("train_gpt: {}", e.what()));
  }
  // ZB-V's two chunks are its V; interleaved takes --chunks; the others run one.
  if (o.parallel.schedule == pipeline::ScheduleKind::ZeroBubbleV) {
    o.parallel.chunks = 2;
  } else if (o.parallel.schedule != pipeline::ScheduleKind::Interleaved1F1B) {
    o.parallel.chunks = 1;
  }
}

}  // namespace tessera::train
