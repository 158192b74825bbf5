// tessera_plan's command line on CLI11 (contract in options.h).
#include "plan/options.h"

#include <CLI/CLI.hpp>
#include <cstdlib>

namespace tessera::planapp {

Options parseOptions(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tessera-plan: the best layout for a model on a cluster, predicted from a card's measured costs "
      "(docs/multi-node.md)",
      "tessera-plan"};
  app.require_subcommand(1);
  auto* cal =
      app.add_subcommand("calibrate", "measure this machine's GPU (GEMMs, attention, kernels, AdamW) into a file");
  cal->add_option("--out", o.out, "calibration file to add this card's entry to")->required();
  cal->add_option("--models", o.models,
                  "model shapes to measure the GEMMs of (presets or HF config.json, "
                  "with :key=value overrides)");
  cal->add_option("--tp", o.tp, "tensor-parallel degrees to measure the sharded shapes of");
  cal->add_option("--tokens", o.tokens, "tokens per micro-batch (rows of the GEMMs)");
  cal->add_option("--seqs", o.seqs, "sequence lengths for attention");
  cal->add_option("--intra-link", o.intraLink,
                  "JSON link (measured collectives) to store as the card's intra-node link");
  cal->add_flag("--no-fp8", o.noFp8, "skip the FP8 GEMMs");
  for (auto* sub : {app.add_subcommand("search", "rank every layout of the model over the cluster"),
                    app.add_subcommand("predict", "predict one layout (--layout)")}) {
    sub->add_option("--model", o.model, "preset, HF config.json or a directory holding one (:key=value overrides)");
    sub->add_option("--calibration", o.calibration, "calibration file (bench/plan/calibration.json)")->required();
    sub->add_option("--card", o.card,
                    "the card's entry in the calibration file (default: this machine's GPU, else the file's only one)");
    sub->add_option("--cluster", o.cluster, "cluster JSON (gpus_per_node, memory_gib, intra and inter links)");
    sub->add_option("--gpus", o.gpus, "GPUs in the job");
    sub->add_option("--gpus-per-node", o.gpusPerNode, "GPUs per node (without --cluster)");
    sub->add_option("--memory", o.memoryGiB, "GiB per GPU (default: the calibrated card's)");
    sub->add_option("--seq", o.seq, "sequence length (default: the model's)");
    sub->add_option("--batch", o.batch, "global batch in sequences per optimizer step")->required();
    sub->add_flag("--fp8", o.fp8, "tensorwise FP8 on the blocks' linears");
    sub->add_option("--recompute", o.recompute, "recompute modes to consider (predict: the first)");
    sub->add_option("--json", o.json, "also write the result as JSON here");
    if (sub->get_name() == "search") {
      sub->add_option("--top", o.top, "layouts to show");
      sub->add_option("--refused", o.refused, "refused layouts to show (with their reasons)");
      sub->add_option("--micro-batch", o.microBatchSizes, "micro-batch sizes to consider");
      sub->add_option("--max-cp", o.maxCp, "largest context-parallel degree to consider");
    } else {
      sub->add_option("--layout", o.layout, "e.g. dp=4,tp=2,fsdp,mb=1,m=8 (pp=, cp=, vp=, 1f1b | zb-h1 | zbv, keep)")
          ->required();
    }
  }
  auto* many = app.add_subcommand("predict-many", "predict a JSON list of layouts in one process (validate.py)");
  many->add_option("--calibration", o.calibration, "calibration file")->required();
  many->add_option("--requests", o.requests, "JSON list of {card, model, gpus, seq, batch, layout, recompute, fp8}")
      ->required();
  many->add_option("--json", o.json, "where the list of predictions (or {error}) goes")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  for (auto* sub : app.get_subcommands()) o.command = sub->get_name();
  return o;
}

}  // namespace tessera::planapp
