// The mixture-of-experts flags (ModelConfig::moe, models/moe.h), under Megatron-LM's names. Each
// defaults to the --model preset's value (moe-tiny has experts; the dense presets none).
#include "train/flag_kinds.h"
#include "train/flags.h"

namespace tessera::train {

std::vector<Flag> moeFlags() {
  return {
      ofPreset(integerFlag("--num-experts", "E", "routed experts of each sparse layer (0: a dense model; Llama)", 0,
                           kNoMax, FIELD(model.cfg.moe.experts))),
      ofPreset(integerFlag("--moe-router-topk", "K", "experts per token", 1, kNoMax, FIELD(model.cfg.moe.topK))),
      ofPreset(integerFlag("--moe-ffn-hidden-size", "F", "each expert's SwiGLU width (0: --ffn-hidden-size)", 0, kNoMax,
                           FIELD(model.cfg.moe.expertFfn))),
      ofPreset(integerFlag("--moe-shared-expert-intermediate-size", "F", "the shared experts' width (0: none)", 0,
                           kNoMax, FIELD(model.cfg.moe.sharedFfn))),
      ofPreset(choiceFlag(
          "--moe-router-score-function", "softmax|sigmoid", "router scores", models::parseRouterScore,
          [](models::RouterScore s) { return models::toString(s); }, FIELD(model.cfg.moe.score))),
      ofPreset(twoWordFlag("--moe-norm-topk", "on|off", "off", "on", "renormalise the chosen experts' probabilities",
                           FIELD(model.cfg.moe.normTopK))),
      ofPreset(numberFlag("--moe-aux-loss-coeff", "X", "load-balancing loss coefficient", 0, false,
                          FIELD(model.cfg.moe.auxLossCoef))),
      ofPreset(
          numberFlag("--moe-z-loss-coeff", "X", "router z-loss coefficient", 0, false, FIELD(model.cfg.moe.zLossCoef))),
      ofPreset(numberFlag("--moe-router-bias-update-rate", "X", "auxiliary-loss-free balancing's bias step (0: off)", 0,
                          false, FIELD(model.cfg.moe.biasUpdateRate))),
      ofPreset(numberFlag("--moe-expert-capacity-factor", "X", "tokens an expert takes, x its fair share (0: dropless)",
                          0, false, FIELD(model.cfg.moe.capacityFactor))),
      ofPreset(integerFlag("--moe-first-dense-layers", "N", "the first N layers keep a dense MLP", 0, kNoMax,
                           FIELD(model.cfg.moe.firstDense))),
      switchFlag("--moe-force-balanced",
                 "benchmarks: token i of a rank's forward to experts (i k + j) mod E, not the router's top k (its "
                 "scores still weigh them)",
                 false, FIELD(model.moeForceBalanced)),
      switchFlag("--fp8-experts",
                 "with --fp8: the routed experts' forward GEMMs in FP8 too (rowwise E4M3, grouped kernel on sm_90; "
                 "slower than bf16 at OLMoE's expert shape on an H200: docs/design/models.md)",
                 false, FIELD(precision.fp8Experts)),
  };
}

}  // namespace tessera::train
