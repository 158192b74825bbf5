#pragma once
// A training run's whole configuration: one struct tree, filled from a command line or a TOML file
// (the same `name = value` keys as the flags, train_gpt --help lists them), written back as TOML,
// and resolved against the world size. Local and pure, but for the environment's defaults passed
// in as a Machine. Bad flags, values, files and layouts are UsageError naming the flag and value.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/settings.h"
#include "tessera/common/error.h"
#include "tessera/common/host_sync.h"
#include "tessera/data/token_source.h"
#include "tessera/fp8/fake_quant.h"
#include "tessera/models/config.h"
#include "tessera/nn/recompute.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/parallel/pipeline/schedule.h"
#include "tessera/parallel/tensor/linear_overlap.h"

namespace tessera::train {

// A bad flag, value, config file or layout: what the user asked for cannot run.
class UsageError : public Error {
 public:
  using Error::Error;
};

enum class DpMode { Ddp, Fsdp };
enum class Precision { Fp32, Bf16 };
// A step whose loss or gradient norm is not finite: the run stops (before any save), or its update
// is skipped (a host wait each step to know it in time).
enum class NanPolicy { Stop, SkipStep };
// A setting the run may decide itself (resolved where the facts are known, e.g. parallelize.cpp).
enum class OnOffAuto { Auto, On, Off };
// FSDP with micro-batches: where their gradients add up: a float32 copy of this rank's whole model
// (Local: one reduce-scatter a step) or the float32 shards (Sharded: a reduce-scatter per micro-batch).
enum class FsdpAccumulate { Auto, Local, Sharded };
const char* toString(DpMode m);     // "ddp" | "fsdp"
const char* toString(OnOffAuto s);  // "auto" | "on" | "off"
const char* toString(FsdpAccumulate a);  // "auto" | "local" | "sharded"
const char* toString(Precision p);  // "fp32" | "bf16"
const char* toString(NanPolicy p);  // "stop" | "skip-step"

// What the defaults depend on: a GPU run (bf16, fused kernels, the 735m model, MFU at 989
// TFLOP/s) or a CPU run, and the environment's TESSERA_* settings (overlap, profiler).
struct Machine {
  bool gpu = false;
  Settings env;
  // This process's: a GPU run where a CUDA device is visible and env does not force Gloo. The
  // overload without settings reads them (Settings::fromEnvironment): call it at the top.
  static Machine detect(Settings env);
  static Machine detect();
};

struct ModelSection {
  std::string preset;       // --model; "hf" or "checkpoint" when the model came from there
  models::ModelConfig cfg;  // the preset, then the shape flags
  bool moeForceBalanced = false;  // benchmarks: experts chosen by token position (models/moe.h)
};

struct ParallelSection {
  int dp = 0, pp = 1, cp = 1, tp = 1;  // dp 0: world / (pp · cp · tp)
  // --layout auto: the Trainer asks tessera-plan's search (plan/search.h) for the fastest layout that
  // fits, from planCalibration's entry for this GPU, before resolving (train/auto_layout.cpp).
  bool autoLayout = false;
  std::string planCalibration;
  int ep = 1;                          // expert parallel: the MoE experts split over ep of the dp · cp ranks
  DpMode dpMode = DpMode::Ddp;
  int microBatches = 0;  // 0: 1 without pp, else 2 · pp (gradient accumulation without pp)
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;
  int chunks = 2;        // virtual stages per rank (interleaved; zbv: 2; 1 otherwise)
  int extraWarmup = 0;   // 1F1B's extra warm-up forwards
  std::vector<int> layersPerStage;  // empty: balanced by compute
  bool sequenceParallel = false;
  tp::LinearOverlap overlap;  // the TP layers' collectives beside their GEMMs (environment defaults)
  int ddpBucketMiB = 25;
  int64_t fsdpPrefetchMiB = -1;  // -1: auto (autoPrefetchBudget)
  // FSDP with micro-batches: units gathered once per step and kept until the optimizer (ZeRO-2's
  // regime; FP8 codes then cast once per step). Auto: on where every unit gathered at once fits a
  // quarter of the GPU's memory (parallelize.cpp, keepsGatheredThroughStep); off on CPUs.
  OnOffAuto fsdpKeepGathered = OnOffAuto::Auto;
  // Auto: Sharded where a float32 copy of this rank's parameters would take more than a quarter of the
  // GPU's memory (parallelize.cpp, accumulatesSharded); Local otherwise.
  FsdpAccumulate fsdpAccumulate = FsdpAccumulate::Auto;
  bool gradReduceBf16 = false;   // DDP's all-reduce / FSDP's reduce-scatter in bf16
  bool zeroGrads = false;        // DDP zeroes .grad after the step (else marks it stale)
  bool embGradGather = true;     // DDP, tied table: the lookup's rows gathered at the end of backward
  bool fsdpEmbRows = false;      // FSDP, tied table: the same
};

struct OptimSection {
  int64_t batch = 0;        // global batch in sequences; 0: 8 · dp (a resumed run: the checkpoint's)
  bool batchGiven = false;  // --batch was given: a resume takes it over the checkpoint's
  bool batchFromCheckpoint = false;  // batch is the checkpoint's (resolve() says so in its errors)
  int steps = 5;
  optim::LrSchedule lr;     // total = steps
  double clip = 1.0, weightDecay = 0.01;
  bool decayEmbeddings = true;
  NanPolicy nanPolicy = NanPolicy::Stop;
};

struct DataSection {
  std::string data = "synthetic";  // "synthetic", a path, or a blend "W1 P1 W2 P2"
  std::string validData;           // separate validation data (else the split's share)
  std::string split = "100";
  data::Format format = data::Format::Auto;
  int64_t eodToken = -1;
  int evalEvery = 0;    // validation loss every N steps and at the end; 0: never
  int evalBatches = 4;  // global batches of the validation share per evaluation
};

struct CheckpointSection {
  std::string dir;          // empty: no checkpoints; else the root of step-<N> directories (series.h)
  int every = 0;            // 0: only at the end
  int keepLast = 3;         // the newest checkpoints kept (0: all)
  bool async = true;        // written from host copies on a thread while training goes on
  std::string initFromHf;   // weights of an HF Llama directory (fresh optimizer and data)
  int saveHfEvery = 0;
  std::string saveHfDir, saveHfAtEnd, saveHfDtype = "bf16";
};

struct PrecisionSection {  // and the kernels and recomputation that go with it
  Precision precision = Precision::Fp32;
  fp8::Recipe fp8 = fp8::Recipe::Off;
  std::vector<int> fp8SkipBlocks;  // negative: from the end
  bool fp8Experts = false;         // the routed experts' forward GEMMs in FP8 too (models/moe.h: MoeImpl::fp8)
  nn::Recompute recompute = nn::Recompute::None;
  bool fusedKernels = false;  // tessera's fused kernels and multi-tensor AdamW
  bool fusedWgrad = true;     // DDP: weight gradients summed in fp32 by the GEMM
  bool repeatKvHeads = false;
};

struct LoggingSection {
  std::string jsonl = "train_gpt.jsonl";  // rank 0's JSONL log; empty: none
  bool breakdown = false;                 // device syncs to time each backward and each phase's memory
  SyncDebug syncDebug = SyncDebug::Off;
  double peakTflops = 0;  // per-GPU peak for MFU; 0: none
  std::string profile;    // PATH[:FIRST[:COUNT]]
  bool profileCpu = true;
};

struct Config {
  ModelSection model;
  ParallelSection parallel;
  OptimSection optim;
  DataSection data;
  CheckpointSection checkpoint;
  PrecisionSection precision;
  LoggingSection logging;
  uint64_t seed = 1234;  // the weights and the data order
  int timeoutS = 0;      // every collective's limit in seconds; 0: the environment's (TESSERA_TIMEOUT_S, 600)
  bool help = false;     // --help was given
  bool printConfig = false;  // --print-config: the resolved config printed, nothing trained

  // This machine's defaults.
  static Config defaults(const Machine& m = {});
  // The flags (argv[1..], or args) and the --config FILE they name; flags given win over the
  // file. Without --model the model is --init-from-hf's directory's, else the checkpoint's.
  static Config parse(int argc, char** argv, const Machine& m = {});
  static Config parse(const std::vector<std::string>& args, const Machine& m = {});
  static Config fromToml(const std::string& path, const Machine& m = {});
  // Every flag's value as `name = value` lines that parse() reads back (--config).
  std::string toToml() const;
  // Fills dp, micro-batches and batch from the world size; checks that the layout fits the model.
  void resolve(int world);
  std::string describe() const;  // one line: layout, batch, precision, schedule
};

// --help's text: every flag with its default on this machine, the presets.
std::string usage(const Machine& m = {});
// The model a run without --model takes: --init-from-hf's directory's, else the checkpoint's.
std::optional<models::ModelConfig> savedModelConfig(const std::string& initFromHf, const std::string& checkpointDir);
// The composer's choices that follow from the config (parallelize.h):
bool usesFusedWgrad(const Config& c);        // weight gradients summed in the GEMM (DDP and FSDP)
bool gathersEmbeddingRows(const Config& c);  // a tied table's lookup rows gathered (no pipeline)

}  // namespace tessera::train
