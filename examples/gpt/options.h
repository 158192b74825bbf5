#pragma once
// train_gpt's command line (CLI11): --name value or --name=value, switches --name or
// --name=on|off; --config FILE.toml gives any flag as `name = value` (flags on the command line
// win); --help prints every flag with its default. Bad flags, values, config files and layouts
// are UsageError naming the flag and the value (train_gpt exits 2 on them).
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/settings.h"
#include "common/error.h"
#include "common/host_sync.h"
#include "data/token_source.h"
#include "models/config.h"
#include "fp8/fake_quant.h"
#include "nn/recompute.h"
#include "optim/lr_schedule.h"
#include "parallel/tensor/linear_overlap.h"
#include "pipeline/schedule.h"

namespace tessera::gpt {

enum class DpMode { Ddp, Fsdp };
enum class Precision { Fp32, Bf16 };
const char* toString(DpMode m);     // "ddp" | "fsdp"
const char* toString(Precision p);  // "fp32" | "bf16"

// A bad flag, value, config file or layout: what the user asked for cannot run.
class UsageError : public Error {
 public:
  using Error::Error;
};

// USAGE_CHECK(cond, "fmt {}", args...): throws UsageError with the formatted message (needs fmt).
#define USAGE_CHECK(cond, ...)                                               \
  do {                                                                       \
    if (!(cond)) throw ::tessera::gpt::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)

struct TrainOptions {
  int dp = 0, pp = 1, tp = 1;     // dp 0: world / (pp · cp · tp)
  int cp = 1;                     // context parallel: each sequence split over cp ranks (parallel/context/)
  DpMode dpMode = DpMode::Ddp;
  int microBatches = 0;           // 0: 1 without pp, else 2 · pp (gradient accumulation without pp)
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;
  int chunks = 2;                 // virtual stages per rank (interleaved only)
  int extraWarmup = 0;            // 1F1B's extra warm-up forwards (pipeline/schedule.h)
  std::vector<int> layersPerStage;
  std::string model;              // preset (models/config.h); empty: tiny on CPU, 735m on GPU
  models::ModelConfig cfg;        // the preset, then the shape flags
  int64_t batch = 0;              // global batch (sequences per step); 0: 8 · dp (a resumed run: the checkpoint's)
  bool batchGiven = false;        // --batch was given (command line or --config): a resume takes it over the checkpoint's
  int steps = 5;
  double clip = 1.0, weightDecay = 0.01;
  optim::LrSchedule lr;           // --lr, --lr-schedule, --min-lr, --warmup, --decay-steps (total: steps)
  bool decayEmbeddings = true;    // weight decay on embedding tables (never on norms and biases)
  nn::Recompute recompute = nn::Recompute::None;
  int evalEvery = 0;              // validation loss every N steps (and at the end); 0: never
  int evalBatches = 4;            // global batches of the validation share per evaluation
  Precision precision = Precision::Fp32;  // default: fp32 on CPU, bf16 on GPU
  fp8::Recipe fp8 = fp8::Recipe::Off;     // the blocks' linears (GPU: cuBLASLt FP8; CPU: emulation)
  std::vector<int> fp8SkipBlocks;         // blocks kept out of FP8 (negative: from the end)
  uint64_t seed = 1234;
  // Data (src/data/dataset.h): "synthetic", or a path / Megatron blend "W1 PATH1 W2 PATH2".
  std::string data = "synthetic";
  std::string validData;          // separate validation data (else the split's share)
  std::string split = "100";      // training,validation[,test] shares of the documents
  data::Format dataFormat = data::Format::Auto;
  int64_t eodToken = -1;          // end-of-document token: appended where missing, ends stream documents
  bool sequenceParallel = false;
  bool gradReduceBf16 = false;    // DDP's all-reduce and FSDP's reduce-scatter in bf16 (else float32)
  int ddpBucketMiB = 25;          // DDP's bucket size (DdpOptions::bucketCapBytes)
  bool zeroGrads = false;         // DDP zeroes .grad after the step (else marks it: overwriteStaleGrads)
  bool repeatKvHeads = false;     // Llama GQA: k and v repeated before attention (else the kernel reads kv heads)
  bool embGradGather = true;      // DDP, tied table: the lookup's rows gathered (DdpOptions::gatherEmbeddingRows)
  bool fsdpEmbRows = false;       // FSDP, tied table: the same (FsdpOptions::gatherEmbeddingRows)
  int64_t fsdpPrefetchMiB = -1;  // -1: auto (fsdp::autoPrefetchBudget in sharding/fsdp/unit.h)
  std::string checkpointDir;      // empty: no checkpoints
  int checkpointEvery = 0;        // 0: only at the end (when a directory is given)
  bool asyncCheckpoint = true;    // save on a writer thread from host copies (checkpoint/async_save.h)
  // Hugging Face (src/hf): weights from an HF Llama directory with a fresh optimizer and data
  // position (fine-tuning; without --model the model is the directory's); exports of the model
  // every N steps to <saveHfDir>/step-<s> and at the end to saveHfAtEnd (--save-hf-dtype).
  std::string initFromHf;
  int saveHfEvery = 0;
  std::string saveHfDir, saveHfAtEnd, saveHfDtype = "bf16";
  std::string logJsonl = "train_gpt.jsonl";  // empty: none
  bool breakdown = false;         // time each backward (device syncs) for the step breakdown
  // GPUs: a host synchronization inside a step after the run's first warns or fails the run
  // (common/host_sync.h SyncCheck; the pipeline preamble's with pp > 1 excepted).
  SyncDebug syncDebug = SyncDebug::Off;
  // Weight gradients summed in fp32 by the GEMM into .grad (nn/accum_linear.h) where that applies:
  // DDP, at any tp (FSDP's bf16 parameters keep autograd's). --no-fused-wgrad: off.
  bool fusedWgrad = true;
  double peakTflops = 0;          // per-GPU peak for MFU; 0: no MFU (default 989 on GPUs: H100/H200 bf16 dense)
  // Overlap of the TP layers' collectives with their GEMMs (--tp-forward-chunks, --sm-carveout,
  // --tp-ring; defaults from the environment, Settings); the carveout also serves DDP.
  tp::LinearOverlap overlap;
  std::string profile;            // --profile PATH[:FIRST[:COUNT]] (TESSERA_PROFILE); empty: none
  bool profileCpu = true;         // TESSERA_PROFILE_CPU
  // tessera's fused kernels (models::ChunkOptions::fusedKernels, the fused cross-entropy) and the
  // multi-tensor AdamW: --fused-kernels on|off|auto, default auto (on for GPU runs, off on CPU;
  // parseOptions resolves it). CPU runs with "on" take the kernels' ATen references (the same maths).
  bool fusedKernels = false;
};

// Parses argv (and the --config file it names); `onGpu` picks the defaults, `env`
// (Settings::fromEnvironment()) the defaults of the flags that have a variable. Local. Throws
// UsageError naming the flag and the value; "--help" → TrainOptions::model == "help".
TrainOptions parseOptions(int argc, char** argv, bool onGpu, const Settings& env = {});
// --help's text: every flag with its default on this machine, the presets.
std::string usage(bool onGpu = false, const Settings& env = {});
// The model a run without --model takes (trainer_hf.cpp): the config of --init-from-hf's
// directory, else of the checkpoint at --checkpoint-dir when it holds one; nullopt otherwise.
std::optional<models::ModelConfig> savedModelConfig(const std::string& initFromHf, const std::string& checkpointDir);
// Fills dp, microBatches, batch from the world size; checks that everything fits (UsageError).
void resolveLayout(TrainOptions& o, int world);
// The options as a TOML file that --config reads back: every flag's value, one `name = value`
// a line, under the flags' canonical names. For resolved options (after resolveLayout), feeding
// it back with `--config` on a machine of the same kind (GPU or CPU) gives equal options: dp,
// micro-batches and batch as resolved, the environment's defaults (TESSERA_TP_*, TESSERA_PROFILE)
// as they were (TESSERA_PROFILE_CPU has no flag). Strings must not hold '#', a newline, or both
// kinds of quote (CLI11's TOML reader has no escapes). Local, pure.
std::string configToml(const TrainOptions& o);
std::string describe(const TrainOptions& o);
// Whether the linears sum their weight gradients in the GEMM: fusedWgrad where it applies
// (DDP, any tp).
bool usesFusedWgrad(const TrainOptions& o);
// Whether DDP gathers the tied table's embedding rows (DdpOptions::gatherEmbeddingRows) and the
// lookup is untracked: DDP over several ranks, fused weight gradients, a tied table whose head is
// in the same chunk (no pipeline), and --emb-grad gather.
bool gathersEmbeddingRows(const TrainOptions& o, const models::ModelConfig& c);

}  // namespace tessera::gpt
