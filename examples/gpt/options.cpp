// train_gpt's flags; see options.h.
#include "options.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <sstream>

#include "common/choice.h"
#include "common/error.h"
#include "data/token_source.h"
#include "models/config.h"

namespace tessera::gpt {

namespace {
constexpr Choices<DpMode, 2> kDpMode{"--dp-mode value", {{{DpMode::Ddp, "ddp"}, {DpMode::Fsdp, "fsdp"}}}};
enum class Switch { On, Off, Auto };
constexpr Choices<Switch, 3> kSwitch{"--fused-kernels value",
                                     {{{Switch::On, "on"}, {Switch::Off, "off"}, {Switch::Auto, "auto"}}}};
constexpr Choices<Precision, 2> kPrecision{"--precision value", {{{Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}}}};

// The whole of `v` read by `read` (std::stoll / std::stod), else an error naming the flag.
template <typename T, typename Read>
T parseWhole(const std::string& flag, const std::string& v, const char* what, Read read) {
  try {
    size_t n = 0;
    const T x = read(v, &n);
    if (n == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("train_gpt: {} expects {}, got '{}'", flag, what, v));
}
int64_t toInt(const std::string& flag, const std::string& v) {
  return parseWhole<int64_t>(flag, v, "an integer", [](const std::string& s, size_t* n) { return std::stoll(s, n); });
}
double toDouble(const std::string& flag, const std::string& v) {
  return parseWhole<double>(flag, v, "a number", [](const std::string& s, size_t* n) { return std::stod(s, n); });
}
bool isSwitch(const std::string& flag) {
  for (const char* s : {"--sp", "--breakdown", "--no-fused-wgrad", "--tie-embeddings", "--untie-embeddings",
                        "--no-decay-embeddings", "--tp-ring"}) {
    if (flag == s) return true;
  }
  return false;
}
std::vector<int> toList(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(static_cast<int>(toInt(flag, item)));
  return out;
}
}  // namespace

const char* toString(DpMode m) { return kDpMode.name(m); }
const char* toString(Precision p) { return kPrecision.name(p); }

std::string usage() {
  std::string presets;
  for (const auto& name : models::presetNames()) {
    const auto c = models::presetConfig(name);
    presets += fmt::format("  {:<11} {}\n", name, c.describe());
  }
  return "usage: train_gpt [--layout DPxPPxTP | --dp N --pp N --tp N] [--dp-mode ddp|fsdp] [--micro-batches M]\n"
         "  [--schedule 1f1b|gpipe|interleaved] [--chunks V] [--extra-warmup K] [--layers-per-stage a,b,...] [--sp]\n"
         "  [--model PRESET] [--d D] [--layers L] [--heads H] [--kv-heads K] [--ffn F] [--vocab V] [--seq-len T]\n"
         "  [--positions none|learned|rope] [--rope-theta X] [--tie-embeddings | --untie-embeddings]\n"
         "  [--batch B] [--steps S] [--lr X] [--lr-schedule constant|cosine|linear|wsd] [--min-lr X] [--warmup N]\n"
         "  [--decay-steps N] [--clip X] [--weight-decay X] [--no-decay-embeddings] [--recompute none|full|selective]\n"
         "  [--eval-every N] [--eval-batches K] [--precision fp32|bf16] [--seed S]\n"
         "  [--data synthetic|PATH|'W1 PATH1 W2 PATH2 ...'] [--data-format auto|megatron|llmc|raw-uint16|raw-uint32]\n"
         "  [--split TRAIN,VALID[,TEST]] [--valid-data SPEC] [--eod-token ID]\n"
         "  [--fsdp-prefetch-mib N] [--checkpoint-dir DIR] [--checkpoint-every K]\n"
         "  [--init-from-hf HF_DIR] [--save-hf-every N --save-hf-dir DIR] [--save-hf-at-end DIR] [--save-hf-dtype bf16|fp32]\n"
         "  [--log-jsonl FILE] [--breakdown] [--peak-tflops X] [--no-fused-wgrad]\n"
         "  [--tp-forward-chunks N] [--sm-carveout SMS] [--tp-ring] [--profile PATH[:FIRST[:COUNT]]]\n"
         "  [--fused-kernels on|off|auto]\n"
         "Defaults: dp = world / (pp·tp); micro-batches 1 without pp (more: gradient accumulation), else 2·pp;\n"
         "model tiny on CPU, 735m on GPU; precision fp32 on CPU, bf16 on GPU; fused kernels on GPU;\n"
         "batch 8·dp sequences; data synthetic; constant lr 1e-3; weight decay 0.01 (never on norms and\n"
         "biases); --tp-forward-chunks, --sm-carveout, --tp-ring, --profile: TESSERA_TP_FORWARD_CHUNKS,\n"
         "TESSERA_OVERLAP_SM_CARVEOUT, TESSERA_TP_RING, TESSERA_PROFILE, else 1, 0, off, none.\n"
         "Without --model the model is --init-from-hf's (config.json), else the checkpoint's in --checkpoint-dir.\n"
         "--data PATH: a Megatron dataset (PREFIX of PREFIX.bin/.idx), llm.c shards (a glob) or a raw token\n"
         "file (with --data-format raw-uint16|raw-uint32); a blend weighs several (Megatron's syntax).\n"
         "Model presets (any dimension can follow):\n" +
         presets;
}

TrainOptions parseOptions(int argc, char** argv, bool onGpu, const Settings& env) {
  TrainOptions o;
  o.overlap = tp::LinearOverlap::fromSettings(env);
  o.profile = env.profile;
  o.profileCpu = env.profileCpu;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      o.model = "help";
      return o;
    }
    TESSERA_CHECK(a.rfind("--", 0) == 0, "train_gpt: unexpected argument '{}'\n{}", a, usage());
    std::string name = a, value;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (!isSwitch(name)) {
      TESSERA_CHECK(i + 1 < argc, "train_gpt: {} needs a value", name);
      value = argv[++i];
    }
    kv[name] = value;
  }
  auto take = [&](const std::string& n, const std::function<void(const std::string&)>& f) {
    if (auto it = kv.find(n); it != kv.end()) {
      f(it->second);
      kv.erase(it);
    }
  };
  o.model = onGpu ? "735m" : "tiny";
  const bool modelGiven = kv.count("--model") > 0;
  take("--model", [&](const std::string& v) { o.model = v; });
  o.cfg = models::presetConfig(o.model);
  take("--init-from-hf", [&](const std::string& v) { o.initFromHf = v; });
  take("--checkpoint-dir", [&](const std::string& v) { o.checkpointDir = v; });
  if (auto saved = modelGiven ? std::nullopt : savedModelConfig(o.initFromHf, o.checkpointDir)) {
    o.cfg = *saved;  // the shape flags below still apply
    o.model = o.initFromHf.empty() ? "checkpoint" : "hf";
  }
  auto i64 = [&](const char* n, int64_t& x) { take(n, [&](const std::string& v) { x = toInt(n, v); }); };
  auto i32 = [&](const char* n, int& x) { take(n, [&](const std::string& v) { x = static_cast<int>(toInt(n, v)); }); };
  auto dbl = [&](const char* n, double& x) { take(n, [&](const std::string& v) { x = toDouble(n, v); }); };
  auto str = [&](const char* n, std::string& x) { take(n, [&](const std::string& v) { x = v; }); };
  take("--layout", [&](const std::string& v) {
    int d = 0, p = 0, t = 0;
    char x1 = 0, x2 = 0;
    std::stringstream ss(v);
    TESSERA_CHECK((ss >> d >> x1 >> p >> x2 >> t) && x1 == 'x' && x2 == 'x' && ss.eof(),
                  "train_gpt: --layout expects DPxPPxTP (e.g. 2x2x2), got '{}'", v);
    o.dp = d;
    o.pp = p;
    o.tp = t;
  });
  i32("--dp", o.dp);
  i32("--pp", o.pp);
  i32("--tp", o.tp);
  take("--dp-mode", [&](const std::string& v) { o.dpMode = kDpMode.parse(v); });
  i32("--micro-batches", o.microBatches);
  take("--schedule", [&](const std::string& v) { o.schedule = pipeline::parseScheduleKind(v); });
  i32("--chunks", o.chunks);
  i32("--extra-warmup", o.extraWarmup);
  take("--layers-per-stage", [&](const std::string& v) { o.layersPerStage = toList("--layers-per-stage", v); });
  i64("--d", o.cfg.d);
  i64("--layers", o.cfg.layers);
  i64("--heads", o.cfg.heads);
  i64("--kv-heads", o.cfg.kvHeads);
  i64("--ffn", o.cfg.ffn);
  i64("--vocab", o.cfg.vocab);
  i64("--seq-len", o.cfg.seqLen);
  take("--positions", [&](const std::string& v) { o.cfg.positions = models::parsePositions(v); });
  dbl("--rope-theta", o.cfg.ropeTheta);
  take("--tie-embeddings", [&](const std::string&) { o.cfg.tiedEmbeddings = true; });
  take("--untie-embeddings", [&](const std::string&) { o.cfg.tiedEmbeddings = false; });
  o.batchGiven = kv.count("--batch") > 0;
  i64("--batch", o.batch);
  i32("--steps", o.steps);
  dbl("--lr", o.lr.lr);
  take("--lr-schedule", [&](const std::string& v) { o.lr.kind = optim::parseLrKind(v); });
  dbl("--min-lr", o.lr.minLr);
  i64("--warmup", o.lr.warmup);
  i64("--decay-steps", o.lr.decay);
  dbl("--clip", o.clip);
  dbl("--weight-decay", o.weightDecay);
  take("--no-decay-embeddings", [&](const std::string&) { o.decayEmbeddings = false; });
  take("--recompute", [&](const std::string& v) { o.recompute = nn::parseRecompute(v); });
  i32("--eval-every", o.evalEvery);
  i32("--eval-batches", o.evalBatches);
  o.precision = onGpu ? Precision::Bf16 : Precision::Fp32;
  take("--precision", [&](const std::string& v) { o.precision = kPrecision.parse(v); });
  take("--seed", [&](const std::string& v) { o.seed = static_cast<uint64_t>(toInt("--seed", v)); });
  str("--data", o.data);
  str("--valid-data", o.validData);
  str("--split", o.split);
  take("--data-format", [&](const std::string& v) { o.dataFormat = data::parseFormat(v); });
  i64("--eod-token", o.eodToken);
  take("--sp", [&](const std::string&) { o.sequenceParallel = true; });
  take("--breakdown", [&](const std::string&) { o.breakdown = true; });
  take("--no-fused-wgrad", [&](const std::string&) { o.fusedWgrad = false; });
  i64("--fsdp-prefetch-mib", o.fsdpPrefetchMiB);
  i32("--checkpoint-every", o.checkpointEvery);
  i32("--save-hf-every", o.saveHfEvery);
  str("--save-hf-dir", o.saveHfDir);
  str("--save-hf-at-end", o.saveHfAtEnd);
  str("--save-hf-dtype", o.saveHfDtype);
  str("--log-jsonl", o.logJsonl);
  dbl("--peak-tflops", o.peakTflops);
  i32("--tp-forward-chunks", o.overlap.forwardChunks);
  i32("--sm-carveout", o.overlap.smCarveout);
  take("--tp-ring", [&](const std::string&) { o.overlap.ring = true; });
  str("--profile", o.profile);
  o.fusedKernels = onGpu;  // auto: the CUDA kernels on GPUs; CPU runs keep ATen's ops
  take("--fused-kernels", [&](const std::string& v) {
    const auto s = kSwitch.parse(v);
    o.fusedKernels = s == Switch::On || (s == Switch::Auto && onGpu);
  });
  if (o.peakTflops == 0 && onGpu) o.peakTflops = 989;
  TESSERA_CHECK(kv.empty(), "train_gpt: unknown flag '{}'\n{}", kv.begin()->first, usage());
  TESSERA_CHECK(o.precision == Precision::Fp32 || onGpu, "train_gpt: --precision bf16 needs GPUs (CPU runs are fp32)");
  TESSERA_CHECK(o.steps >= 1, "train_gpt: --steps must be >= 1, got {}", o.steps);
  TESSERA_CHECK(o.extraWarmup >= 0 && (o.extraWarmup == 0 || o.schedule == pipeline::ScheduleKind::OneFOneB),
                "train_gpt: --extra-warmup {} needs --schedule 1f1b and a count >= 0 (schedule: {})", o.extraWarmup,
                pipeline::scheduleName(o.schedule));
  TESSERA_CHECK(o.overlap.forwardChunks >= 1 && o.overlap.forwardChunks <= 64,
                "train_gpt: --tp-forward-chunks must be 1 to 64, got {}", o.overlap.forwardChunks);
  TESSERA_CHECK(o.overlap.smCarveout >= 0 && o.overlap.smCarveout < 1024,
                "train_gpt: --sm-carveout must be 0 to 1023 SMs, got {}", o.overlap.smCarveout);
  models::validate(o.cfg);
  TESSERA_CHECK(o.saveHfEvery >= 0 && (o.saveHfEvery == 0 || !o.saveHfDir.empty()),
                "train_gpt: --save-hf-every {} needs --save-hf-dir DIR (each export goes to DIR/step-<s>)", o.saveHfEvery);
  TESSERA_CHECK(o.saveHfDtype == "bf16" || o.saveHfDtype == "fp32", "train_gpt: --save-hf-dtype expects bf16 or fp32, "
                "got '{}'", o.saveHfDtype);
  TESSERA_CHECK((o.saveHfEvery == 0 && o.saveHfAtEnd.empty() && o.initFromHf.empty()) || o.cfg.arch == models::Arch::Llama,
                "train_gpt: --init-from-hf and --save-hf-* take a Llama (--model llama-*), not {}", o.cfg.describe());
  o.lr.total = o.steps;
  optim::validate(o.lr);
  TESSERA_CHECK(o.evalEvery >= 0 && o.evalBatches >= 1, "train_gpt: --eval-every {} must be >= 0, --eval-batches {} >= 1",
                o.evalEvery, o.evalBatches);
  TESSERA_CHECK(!o.data.empty(), "train_gpt: --data needs 'synthetic' or a dataset");
  TESSERA_CHECK(o.evalEvery == 0 || o.data != "synthetic",
                "train_gpt: --eval-every needs validation data (--data PATH with --split or --valid-data)");
  TESSERA_CHECK(o.data != "synthetic" || o.validData.empty(), "train_gpt: --valid-data needs --data PATH (not synthetic)");
  if (o.schedule != pipeline::ScheduleKind::Interleaved1F1B) o.chunks = 1;
  return o;
}

void resolveLayout(TrainOptions& o, int world) {
  TESSERA_CHECK(o.pp >= 1 && o.tp >= 1, "train_gpt: --pp and --tp must be >= 1 (pp {}, tp {})", o.pp, o.tp);
  if (o.dp == 0) {
    TESSERA_CHECK(world % (o.pp * o.tp) == 0, "train_gpt: the world of {} ranks is not divisible by pp {} x tp {}",
                  world, o.pp, o.tp);
    o.dp = world / (o.pp * o.tp);
  }
  TESSERA_CHECK(o.dp * o.pp * o.tp == world, "train_gpt: dp {} x pp {} x tp {} = {} ranks, but the world has {}", o.dp,
                o.pp, o.tp, o.dp * o.pp * o.tp, world);
  if (o.microBatches == 0) o.microBatches = o.pp > 1 ? 2 * o.pp : 1;
  if (o.batch == 0) o.batch = 8 * o.dp;
  TESSERA_CHECK(o.batch % o.dp == 0, "train_gpt: --batch {} is not divisible by dp {}", o.batch, o.dp);
  TESSERA_CHECK((o.batch / o.dp) % o.microBatches == 0,
                "train_gpt: the per-replica batch {} (batch {} / dp {}) is not divisible into {} micro-batches",
                o.batch / o.dp, o.batch, o.dp, o.microBatches);
  const auto& c = o.cfg;
  TESSERA_CHECK(c.heads % o.tp == 0, "train_gpt: heads = {} is not divisible by tp = {}", c.heads, o.tp);
  TESSERA_CHECK(c.arch != models::Arch::Llama || c.kvH() % o.tp == 0 || o.tp % c.kvH() == 0,
                "train_gpt: kv heads = {} and tp = {}: one must divide the other (kv heads split over tp, or each "
                "replicated on tp / kv heads ranks)",
                c.kvH(), o.tp);
  TESSERA_CHECK(c.ffnSize() % o.tp == 0, "train_gpt: the FFN size {} is not divisible by tp = {}", c.ffnSize(), o.tp);
  TESSERA_CHECK(c.vocab % o.tp == 0, "train_gpt: the vocabulary {} is not divisible by tp = {} (vocab-parallel)",
                c.vocab, o.tp);
  TESSERA_CHECK(c.layers >= o.pp * o.chunks, "train_gpt: {} layers cannot fill pp {} x {} chunk(s) = {} stages",
                c.layers, o.pp, o.chunks, o.pp * o.chunks);
  TESSERA_CHECK(!(o.dpMode == DpMode::Fsdp && o.schedule == pipeline::ScheduleKind::Interleaved1F1B),
                "train_gpt: --dp-mode fsdp with --schedule interleaved is not supported (FSDP reduces a unit's "
                "gradients in the last backward that runs it, which interleaving splits across chunks); use 1f1b or "
                "gpipe");
}

bool usesFusedWgrad(const TrainOptions& o) { return o.fusedWgrad && o.dpMode == DpMode::Ddp; }

std::string describe(const TrainOptions& o) {
  const auto& ov = o.overlap;
  const bool overlapSet = ov.forwardChunks > 1 || ov.smCarveout > 0 || ov.ring;
  return fmt::format("dp {} ({}) x pp {} x tp {}{}; {} micro-batches, schedule {}{}; batch {} x T {}; {}{}{}; {} steps; {}{}{}",
                     o.dp, toString(o.dpMode), o.pp, o.tp, o.sequenceParallel ? " +sp" : "", o.microBatches,
                     pipeline::scheduleName(o.schedule),
                     o.chunks > 1                ? fmt::format(" ({} chunks)", o.chunks)
                     : o.extraWarmup > 0 ? fmt::format(" (+{} warm-up forwards)", o.extraWarmup)
                                         : "",
                     o.batch, o.cfg.seqLen, toString(o.precision),
                     usesFusedWgrad(o) ? ", weight gradients summed in the GEMM" : "",
                     o.fusedKernels ? ", fused kernels" : "", o.steps, optim::describe(o.lr),
                     o.recompute != nn::Recompute::None ? fmt::format("; recompute {}", nn::toString(o.recompute)) : "",
                     overlapSet ? fmt::format("; overlap: {} forward pieces, {} SMs kept free{}", ov.forwardChunks,
                                              ov.smCarveout, ov.ring ? ", ring" : "")
                                : "");
}

}  // namespace tessera::gpt
