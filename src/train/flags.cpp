// The flag table; see flags.h. The shape flags take Megatron-LM's names
// (--hidden-size, --num-layers, ...) with the old ones as aliases where safe: no flag or alias may
// be a prefix of a torchrun option, as torchrun's argparse takes abbreviations (--d is ambiguous
// under torch 2.11; tests/train/test_torchrun_prefixes.py).
#include "train/flags.h"

#include <fmt/format.h>

#include <utility>

#include "common/choice.h"
#include "train/flag_kinds.h"

namespace tessera::train {

namespace {
constexpr Choices<DpMode, 2> kDpMode{"dp mode", {{{DpMode::Ddp, "ddp"}, {DpMode::Fsdp, "fsdp"}}}};
constexpr Choices<Precision, 2> kPrecision{"precision", {{{Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}}}};
constexpr Choices<NanPolicy, 2> kNanPolicy{"nan policy",
                                           {{{NanPolicy::Stop, "stop"}, {NanPolicy::SkipStep, "skip-step"}}}};

struct Table {
  std::vector<Flag> flags;
  std::string group;
  void add(Flag f) {
    f.group = group;
    flags.push_back(std::move(f));
  }
};

Flag layersPerStageFlag() {
  return intListFlag("--layers-per-stage", "A,B,...", "blocks of each stage (pp * chunks entries)",
                     "balanced by compute", 1, "a comma-separated list of block counts >= 1",
                     FIELD(parallel.layersPerStage));
}

Flag fp8SkipFlag() {
  return intListFlag("--fp8-skip-blocks", "I,J,...", "blocks kept out of --fp8 (negative: from the end, e.g. 0,-1)",
                     "none", INT_MIN + 1, "a comma-separated list of block indices (negative from the end)",
                     FIELD(precision.fp8SkipBlocks));
}

void layoutFlags(Table& t) {
  t.group = "Layout";
  t.add(layoutFlag());
  t.add(textFlag("--plan-calibration", "FILE", "--layout auto's card costs (bench/plan/calibration.json)",
                 FIELD(parallel.planCalibration)));
  t.add(autoFlag(integerFlag("--dp", "N", "data-parallel size", 1, INT_MAX, FIELD(parallel.dp)),
                 "world / (pp * cp * tp)", 0, FIELD(parallel.dp)));
  t.add(integerFlag("--pp", "N", "pipeline stages (layers >= pp * chunks)", 1, INT_MAX, FIELD(parallel.pp)));
  t.add(integerFlag("--tp", "N", "tensor-parallel size (divides heads, FFN, vocabulary)", 1, INT_MAX,
                    FIELD(parallel.tp)));
  t.add(integerFlag("--cp", "N", "context-parallel size: each sequence split over N ranks (T divisible by 2N)", 1,
                    INT_MAX, FIELD(parallel.cp)));
  t.add(integerFlag("--ep", "N", "expert-parallel size: the MoE experts split over N of the dp x cp ranks", 1, INT_MAX,
                    FIELD(parallel.ep)));
  t.add(choiceFlag(
      "--dp-mode", "ddp|fsdp", "DDP or FSDP on the data axis", [](auto& v) { return kDpMode.parse(v); },
      [](DpMode m) { return toString(m); }, FIELD(parallel.dpMode)));
  t.add(autoFlag(integerFlag("--micro-batches", "M", "micro-batches per step (gradient accumulation without pp)", 1,
                             INT_MAX, FIELD(parallel.microBatches)),
                 "1, with pp 2 * pp", 0, FIELD(parallel.microBatches)));
  t.add(choiceFlag(
      "--schedule", "1f1b|gpipe|interleaved|zb-h1|zbv", "pipeline schedule", pipeline::parseScheduleKind,
      [](pipeline::ScheduleKind k) { return pipeline::scheduleName(k); }, FIELD(parallel.schedule)));
  Flag chunks =
      integerFlag("--chunks", "V", "virtual stages per rank (interleaved only)", 1, INT_MAX, FIELD(parallel.chunks));
  chunks.shown = "2 with interleaved, else 1 (zbv: its V's 2)";
  t.add(chunks);
  t.add(integerFlag("--extra-warmup", "K", "1F1B's extra warm-up forwards (1f1b only)", 0, INT_MAX,
                    FIELD(parallel.extraWarmup)));
  t.add(layersPerStageFlag());
  t.add(switchFlag("--sp", "sequence parallel: norms and residuals on T / tp tokens", false,
                   FIELD(parallel.sequenceParallel)));
}

void modelFlags(Table& t) {
  t.group = "Model (the preset, then any dimension)";
  t.add(modelFlag());
  t.add(ofPreset(
      integerFlag("--hidden-size", "D", "model width (divisible by the heads)", 1, kNoMax, FIELD(model.cfg.d))));
  t.add(ofPreset(integerFlag("--num-layers,--layers", "L", "transformer blocks", 1, kNoMax, FIELD(model.cfg.layers))));
  t.add(ofPreset(
      integerFlag("--num-attention-heads,--heads", "H", "attention heads", 1, kNoMax, FIELD(model.cfg.heads))));
  t.add(autoFlag(integerFlag("--num-query-groups,--kv-heads", "K", "key/value heads (grouped-query attention; Llama)",
                             1, kNoMax, FIELD(model.cfg.kvHeads)),
                 "the preset's (GPT: = heads)", 0, FIELD(model.cfg.kvHeads)));
  t.add(autoFlag(integerFlag("--ffn-hidden-size,--ffn", "F", "MLP width", 1, kNoMax, FIELD(model.cfg.ffn)),
                 "the preset's (GPT: 4 * D)", 0, FIELD(model.cfg.ffn)));
  t.add(ofPreset(integerFlag("--vocab-size,--vocab", "V", "vocabulary (every data token < V)", 1, kNoMax,
                             FIELD(model.cfg.vocab))));
  t.add(ofPreset(integerFlag("--seq-length,--seq-len", "T", "sequence length", 1, kNoMax, FIELD(model.cfg.seqLen))));
  t.add(ofPreset(choiceFlag(
      "--positions", "none|learned|rope", "position encoding (Llama: rope)", models::parsePositions,
      [](models::Positions p) { return models::toString(p); }, FIELD(model.cfg.positions))));
  t.add(ofPreset(numberFlag("--rope-theta", "X", "rotary base", 0, true, FIELD(model.cfg.ropeTheta))));
  t.add(ofPreset(integerFlag("--kv-channels", "HD", "each head's width (HF head_dim; 0: D / heads; Llama)", 0, kNoMax,
                             FIELD(model.cfg.headSize))));
  t.add(ofPreset(choiceFlag(
      "--qk-norm", "none|per-head|whole", "RMSNorm of q and k before the rotation (Qwen3: per-head, OLMoE: whole)",
      models::parseQkNorm, [](models::QkNorm q) { return models::toString(q); }, FIELD(model.cfg.qkNorm))));
  t.add(ofPreset(
      switchFlag("--tie-embeddings", "the head shares the embedding table", false, FIELD(model.cfg.tiedEmbeddings))));
  Flag untie = switchFlag("--untie-embeddings", "the head has its own table", true, FIELD(model.cfg.tiedEmbeddings));
  untie.get = nullptr;  // --tie-embeddings carries it
  t.add(untie);
}

void dataFlags(Table& t) {
  t.group = "Data";
  t.add(textFlag("--data", "SPEC",
                 "synthetic, a Megatron PREFIX, llm.c shards (a glob), a token file, or a blend 'W1 P1 W2 P2'",
                 FIELD(data.data)));
  t.add(choiceFlag(
      "--data-format", "auto|megatron|llmc|raw-uint16|raw-uint32", "how to read --data", data::parseFormat,
      [](data::Format f) { return data::formatName(f); }, FIELD(data.format)));
  t.add(textFlag("--split", "TRAIN,VALID[,TEST]", "shares of the documents", FIELD(data.split)));
  Flag valid = textFlag("--valid-data", "SPEC", "separate validation data (as --data)", FIELD(data.validData));
  valid.shown = "the split's validation share";
  t.add(valid);
  t.add(integerFlag("--eod-token", "ID", "end-of-document token: appended where missing, ends stream documents", -1,
                    kNoMax, FIELD(data.eodToken)));
  t.add(integerFlag("--seed", "S", "seed of the weights and the data order", 0, kNoMax, FIELD(seed)));
}

void optimFlags(Table& t) {
  t.group = "Optimisation";
  Flag batch = autoFlag(integerFlag("--batch", "B", "global batch in sequences (divisible by dp, then micro-batches)",
                                    1, kNoMax, FIELD(optim.batch)),
                        "8 * dp", 0, FIELD(optim.batch));
  batch.set = [set = batch.set](Config& o, const std::string& v) {
    set(o, v);
    o.optim.batchGiven = true;
  };
  t.add(batch);
  t.add(integerFlag("--steps", "S", "training steps (the LR schedule spans them)", 1, INT_MAX, FIELD(optim.steps)));
  t.add(numberFlag("--lr", "X", "peak learning rate", 0, true, FIELD(optim.lr.lr)));
  t.add(choiceFlag(
      "--lr-schedule", "constant|cosine|linear|wsd", "shape after the warm-up", optim::parseLrKind,
      [](optim::LrKind k) { return optim::toString(k); }, FIELD(optim.lr.kind)));
  t.add(numberFlag("--min-lr", "X", "final learning rate (<= lr)", 0, false, FIELD(optim.lr.minLr)));
  t.add(integerFlag("--warmup", "N", "linear warm-up steps (<= steps)", 0, kNoMax, FIELD(optim.lr.warmup)));
  t.add(integerFlag("--decay-steps", "N", "WSD: steps of the final decay (0: steps / 5)", 0, kNoMax,
                    FIELD(optim.lr.decay)));
  t.add(numberFlag("--clip", "X", "gradient-norm clip over dp, pp and tp (<= 0: none)", std::nan(""), false,
                   FIELD(optim.clip)));
  t.add(numberFlag("--weight-decay", "X", "AdamW weight decay (never on norms and biases)", 0, false,
                   FIELD(optim.weightDecay)));
  t.add(switchFlag("--no-decay-embeddings", "no weight decay on the embedding tables", true,
                   FIELD(optim.decayEmbeddings)));
  t.add(choiceFlag(
      "--nan-policy", "stop|skip-step",
      "a NaN or infinite loss or gradient norm: stop the run before any save, or skip that update (a host wait "
      "a step)",
      [](auto& v) { return kNanPolicy.parse(v); }, [](NanPolicy p) { return toString(p); }, FIELD(optim.nanPolicy)));
  t.add(choiceFlag(
      "--recompute", "none|selective|full", "activation recomputation", nn::parseRecompute,
      [](nn::Recompute r) { return nn::toString(r); }, FIELD(precision.recompute)));
  t.add(integerFlag("--eval-every", "N", "validation loss every N steps and at the end (0: never; needs real data)", 0,
                    INT_MAX, FIELD(data.evalEvery)));
  t.add(integerFlag("--eval-batches", "K", "global batches per evaluation", 1, INT_MAX, FIELD(data.evalBatches)));
}

void precisionFlags(Table& t, bool onGpu) {
  t.group = "Precision and kernels";
  t.add(choiceFlag(
      "--precision", "fp32|bf16", "compute precision (bf16: GPUs)", [](auto& v) { return kPrecision.parse(v); },
      [](Precision p) { return toString(p); }, FIELD(precision.precision)));
  t.add(choiceFlag(
      "--fp8", "off|tensorwise|rowwise", "FP8 GEMMs in the blocks' linears (CPU: exact emulation)", fp8::parseRecipe,
      [](fp8::Recipe r) { return fp8::name(r); }, FIELD(precision.fp8)));
  t.add(fp8SkipFlag());
  t.add(twoWordFlag("--gqa", "native|repeat", "native", "repeat",
                    "grouped-query attention: the fused kernel reads the kv heads as they are (LibTorch >= 2.5), or "
                    "k and v are repeated to the query heads first",
                    FIELD(precision.repeatKvHeads)));
  t.add(fusedKernelsFlag(onGpu));
  t.add(switchFlag("--no-fused-wgrad", "weight gradients by autograd, not summed in fp32 by the GEMM", true,
                   FIELD(precision.fusedWgrad)));
  t.add(fsdpPrefetchFlag());
  t.add(fsdpKeepGatheredFlag());
  t.add(fsdpAccumulateFlag());
  t.add(twoWordFlag("--grad-reduce", "fp32|bf16", "fp32", "bf16",
                    "dtype of the data-parallel gradient reduction (bf16: half the bytes, rounded)",
                    FIELD(parallel.gradReduceBf16)));
  t.add(twoWordFlag("--zero-grads", "mark|zero", "mark", "zero",
                    "DDP after each step: mark the gradients for the next GEMMs to overwrite, or zero them",
                    FIELD(parallel.zeroGrads)));
  t.add(twoWordFlag("--emb-grad", "gather|reduce", "reduce", "gather",
                    "DDP, tied table: the lookup's rows all-gathered at the end of backward (the table's all-reduce "
                    "then leaves with the head's gradient), or summed into the table's all-reduce",
                    FIELD(parallel.embGradGather)));
  t.add(switchFlag("--fsdp-emb-rows",
                   "FSDP, tied table: the lookup's rows all-gathered at the end of backward; the table's unit then "
                   "reduce-scatters with the head's gradient, first",
                   false, FIELD(parallel.fsdpEmbRows)));
  t.add(integerFlag("--ddp-bucket-mib", "N", "DDP: MiB of gradients per all-reduce (the first bucket: 1 MiB)", 1, 4096,
                    FIELD(parallel.ddpBucketMiB)));
  t.add(numberFlag("--peak-tflops", "X", "per-GPU peak TFLOP/s for the MFU column (0: no MFU)", 0, false,
                   FIELD(logging.peakTflops)));
}

void checkpointFlags(Table& t) {
  t.group = "Checkpoints and logging";
  t.add(textFlag("--checkpoint-dir", "DIR",
                 "save to DIR/step-<N> (DIR/latest names the newest); resume from the newest complete one",
                 FIELD(checkpoint.dir)));
  t.add(integerFlag("--checkpoint-every", "K", "save every K steps and at the end (0: only at the end)", 0, INT_MAX,
                    FIELD(checkpoint.every)));
  t.add(integerFlag("--keep-last", "K", "checkpoints kept under --checkpoint-dir, the newest (0: all)", 0, INT_MAX,
                    FIELD(checkpoint.keepLast)));
  t.add(twoWordFlag("--async-checkpoint", "on|off", "off", "on",
                    "save from host copies on a writer thread while training goes on", FIELD(checkpoint.async)));
  t.add(textFlag("--log-jsonl", "FILE", "rank 0's JSONL log (empty: none)", FIELD(logging.jsonl)));
  t.add(switchFlag("--breakdown", "time each backward (device syncs) and log memory per phase of a step on GPUs", false,
                   FIELD(logging.breakdown)));
  t.add(choiceFlag(
      "--sync-debug", "off|warn|error", "GPUs: a host sync inside a step (after the first) warns or ends the run",
      [](const std::string& v) {
        for (auto k : {SyncDebug::Off, SyncDebug::Warn, SyncDebug::Error})
          if (v == toString(k)) return k;
        throw UsageError(fmt::format("train_gpt: --sync-debug takes off, warn or error, got '{}'", v));
      },
      [](SyncDebug k) { return toString(k); }, FIELD(logging.syncDebug)));
}

void hfFlags(Table& t) {
  t.group = "Hugging Face (Llama; without --model the model is --init-from-hf's, else the checkpoint's)";
  t.add(textFlag("--init-from-hf", "HF_DIR",
                 "weights from an HF Llama directory; fresh optimizer and data (fine-tuning)",
                 FIELD(checkpoint.initFromHf)));
  t.add(integerFlag("--save-hf-every", "N", "export the model every N steps to --save-hf-dir/step-<s> (0: never)", 0,
                    INT_MAX, FIELD(checkpoint.saveHfEvery)));
  t.add(textFlag("--save-hf-dir", "DIR", "where --save-hf-every's exports go", FIELD(checkpoint.saveHfDir)));
  t.add(
      textFlag("--save-hf-at-end", "DIR", "export the trained model there at the end", FIELD(checkpoint.saveHfAtEnd)));
  t.add(choiceFlag(
      "--save-hf-dtype", "bf16|fp32", "the exports' dtype",
      [](const std::string& v) {
        if (v == "bf16" || v == "fp32") return v;
        throw UsageError(fmt::format("train_gpt: --save-hf-dtype expects bf16 or fp32, got '{}'", v));
      },
      [](const std::string& v) { return v; }, FIELD(checkpoint.saveHfDtype)));
}

void generalFlags(Table& t) {
  t.group = "General";
  t.add(integerFlag("--timeout", "S",
                    "seconds any collective or store wait may take before the run ends naming it (0: "
                    "TESSERA_TIMEOUT_S, else 600)",
                    0, INT_MAX, FIELD(timeoutS)));
  Flag print = switchFlag("--print-config", "print the resolved config (what --config reads) and exit", false,
                          FIELD(printConfig));
  print.get = nullptr;  // never in a config file
  t.add(print);
}

void overlapFlags(Table& t) {
  t.group = "Overlap and profiling (defaults: TESSERA_* variables)";
  t.add(integerFlag("--tp-forward-chunks", "N", "TP layers' forward in N pieces beside their collectives", 1, 64,
                    FIELD(parallel.overlap.forwardChunks)));
  t.add(integerFlag("--sm-carveout", "SMS", "SMs kept free of GEMMs beside collectives", 0, 1023,
                    FIELD(parallel.overlap.smCarveout)));
  t.add(switchFlag("--tp-ring", "row-parallel forward reduced by a ring of point-to-point transfers", false,
                   FIELD(parallel.overlap.ring)));
  t.add(textFlag("--profile", "PATH[:FIRST[:COUNT]]", "Kineto trace of COUNT (2) steps from FIRST (3)",
                 FIELD(logging.profile)));
}
}  // namespace

const char* toString(DpMode m) { return kDpMode.name(m); }
const char* toString(Precision p) { return kPrecision.name(p); }
const char* toString(NanPolicy p) { return kNanPolicy.name(p); }

std::vector<Flag> flagTable(bool onGpu) {
  Table t;
  layoutFlags(t);
  modelFlags(t);
  t.group = "Mixture of experts (Llama)";
  for (auto& f : moeFlags()) t.add(std::move(f));
  dataFlags(t);
  optimFlags(t);
  precisionFlags(t, onGpu);
  checkpointFlags(t);
  hfFlags(t);
  overlapFlags(t);
  generalFlags(t);
  return t.flags;
}

}  // namespace tessera::train
