#pragma once
// --layout auto: the layout tessera-plan predicts fastest, chosen where the run starts (train_gpt
// before it prints its resolved config; the Trainer when its config still asks for it). Local and
// deterministic: every rank reads the same calibration file and computes the same choice from the
// same world size, node size and GPU (the pipeline's and wrappers' agreement checks catch a mismatch).
#include "tessera/comm/bootstrap/init.h"
#include "tessera/train/config.h"

namespace tessera::train {

// Replaces the config's layout (dp, pp, cp, tp, FSDP or DDP, sequence parallel, micro-batches,
// schedule, virtual stages, FSDP's keep-gathered and accumulation, recompute) with the fastest one
// plan::search predicts for this model, sequence length, global batch and precision on the world's
// GPUs (ctx.launch.localWorldSize per node, this device's memory), from o.parallel.planCalibration's
// entry for this device's card; then o.parallel.autoLayout is false. Logs the choice and its prediction
// on rank 0. Errors (tessera::Error):
// no calibration file, no entry for the card, no --batch, a mixture-of-experts model, no layout fits.
void chooseLayout(Config& o, const Context& ctx);

}  // namespace tessera::train
