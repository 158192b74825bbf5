// A run's checkpoints (src/checkpoint): every parameter under the unsharded model's name (each
// rank's box of it) with AdamW's exp_avg / exp_avg_sq in the same boxes ("optim.exp_avg.<name>",
// "optim.exp_avg_sq.<name>"), so a checkpoint loads into any dp / pp / cp / tp layout and either
// data-parallel mode (the pieces: DataParallel::savePieces / loadPieces). Beside them the step, the
// data position, the model's config, the global batch and the run's config.toml. Saving is
// collective over the world (checkpoint::save); replicas write once.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/series.h"
#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "tessera/models/config_json.h"
#include "train/flags.h"
#include "train/trainer_state.h"

namespace tessera::train {

void Trainer::State::saveCheckpoint() {
  const int64_t step = stepsDone;
  const auto pieces = par.dp->savePieces([this] { return par.pieces(); });
  std::map<std::string, std::string> extra{{"layout", o.describe()},
                                           {"model", o.model.cfg.signature()},
                                           {"model_config", models::configToJson(o.model.cfg)},
                                           {"global_batch", std::to_string(o.optim.batch)},
                                           {"steps", std::to_string(o.optim.steps)},
                                           {"data_state", data::encodeDataState(batches->state())}};
  if (!hfConfig.empty()) {  // an HF export of this checkpoint keeps the imported model's other fields
    extra.emplace("hf_config", hfConfig);
    extra.emplace("hf_source", hfSource);
  }
  // The run's resolved config beside the tensors: `train_gpt --config <dir>/config.toml` runs it
  // again; the root keeps a copy of the newest one's (written once that checkpoint is committed).
  const std::string toml = o.toToml();
  const std::map<std::string, std::string> files{{"config.toml", toml}};
  const std::string root = o.checkpoint.dir, dir = checkpoint::stepDir(root, step);
  const int keep = o.checkpoint.keepLast;
  lastCheckpoint = dir;
  auto commit = [root, step, keep, files] { checkpoint::commitStep(root, step, keep, files); };  // rank 0
  if (saver) {  // staged to host memory here; written, published and committed on the saver's thread
    saver->save(dir, pieces, step, extra, files, commit);
    if (isLogger()) log::info("train_gpt: checkpoint of step {} staged; writing it to {}", step, dir);
    return;
  }
  synchronizeDevice(device);
  checkpoint::save(dir, pieces, *ctx.world, step, extra, files);
  if (isLogger()) {
    commit();
    log::info("train_gpt: checkpoint of step {} saved to {}", step, dir);
  }
}

std::optional<int64_t> savedGlobalBatch(const std::string& checkpointDir) {
  const auto found = checkpointDir.empty() ? std::nullopt : checkpoint::find(checkpointDir);
  if (!found) return std::nullopt;
  const auto meta = checkpoint::readMetadata(found->dir);
  const auto it = meta.extra.find("global_batch");
  if (meta.extra.count("weights_only") || it == meta.extra.end()) return std::nullopt;
  return std::stoll(it->second);
}

void Trainer::State::adoptCheckpointBatch(const std::map<std::string, std::string>& extra, const std::string& dir) {
  const auto it = extra.find("global_batch");
  if (it == extra.end()) return;  // saved by an older train_gpt: this run's batch
  const int64_t saved = std::stoll(it->second);
  if (saved == o.optim.batch) {
    if (o.optim.batchFromCheckpoint && isLogger()) {
      log::info("train_gpt: keeping the checkpoint's global batch of {} sequences (--batch changes it)", saved);
    }
    return;
  }
  if (o.optim.batchGiven) {
    if (isLogger()) {
      log::warn(
          "train_gpt: THE GLOBAL BATCH CHANGES on resume: the checkpoint in {} was trained with {} sequences a "
          "step, this run takes {} (--batch). Steps from here on see {} sequences each.",
          dir, saved, o.optim.batch, o.optim.batch);
    }
    return;
  }
  const int64_t layoutDefault = o.optim.batch;
  TESSERA_CHECK(saved % o.parallel.dp == 0 && (saved / o.parallel.dp) % o.parallel.microBatches == 0,
                "train_gpt: the checkpoint in {} was trained with a global batch of {} sequences, which dp {} x {} "
                "micro-batches cannot split; give --batch to change it",
                dir, saved, o.parallel.dp, o.parallel.microBatches);
  o.optim.batch = saved;
  if (isLogger()) {
    log::info(
        "train_gpt: keeping the checkpoint's global batch of {} sequences (this layout's default would be {}; "
        "--batch changes it)",
        saved, layoutDefault);
  }
}

void Trainer::State::warnScheduleChange(const std::map<std::string, std::string>& extra) const {
  const auto it = extra.find("steps");  // saved since issue 52
  if (it == extra.end() || o.optim.lr.kind == optim::LrKind::Constant || !isLogger()) return;
  auto before = o.optim.lr;
  before.total = std::stoll(it->second);
  if (before.total == o.optim.lr.total) return;
  log::warn(
      "train_gpt: THE LR SCHEDULE CHANGES on resume: the checkpoint was trained toward {} steps, this run's {} "
      "schedule spans {}: the lr of step {} is {:.3g} (it was going to be {:.3g})",
      before.total, optim::toString(o.optim.lr.kind), o.optim.lr.total, startStep + 1,
      optim::lrAt(o.optim.lr, startStep), optim::lrAt(before, startStep));
}

bool Trainer::State::loadCheckpoint() {
  // The newest complete checkpoint under the directory; an incomplete or damaged one is refused
  // (checkpoint::find throws naming what is missing), never taken for "no checkpoint".
  const auto found = o.checkpoint.dir.empty() ? std::nullopt : checkpoint::find(o.checkpoint.dir);
  if (!found) {
    batches->start(nullptr, 0);
    return false;
  }
  if (!found->note.empty() && isLogger()) log::warn("train_gpt: CHECKPOINT FALLBACK: {}", found->note);
  at::NoGradGuard ng;
  bool weightsOnly = false;
  {  // the architecture first: a checkpoint of another model is refused before any tensor is read
    const auto saved = checkpoint::readMetadata(found->dir);
    const auto it = saved.extra.find("model");
    TESSERA_CHECK(it == saved.extra.end() || it->second == o.model.cfg.signature(),
                  "train_gpt: the checkpoint in {} is of another model:\n  checkpoint: {}\n  this run:   {}",
                  found->dir, it->second, o.model.cfg.signature());
    adoptCheckpointBatch(saved.extra, found->dir);
    if (saved.extra.count("hf_config")) {
      hfConfig = saved.extra.at("hf_config");
      hfSource = saved.extra.count("hf_source") ? saved.extra.at("hf_source") : "";
    }
    weightsOnly = saved.extra.count("weights_only") > 0;
  }
  // A weights-only checkpoint (tessera-convert import-hf): the parameters only; AdamW's moments
  // stay zero and its step 0 (a fresh optimizer), the data starts from the beginning.
  auto onlyWeights = [&](std::vector<checkpoint::Piece> ps) {
    if (!weightsOnly) return ps;
    std::vector<checkpoint::Piece> out;
    for (auto& p : ps) {
      if (p.name.rfind("optim.", 0) != 0) out.push_back(std::move(p));
    }
    return out;
  };
  auto target = par.dp->loadPieces([this] { return par.pieces(); });
  auto pieces = onlyWeights(std::move(target.pieces));
  const auto meta = checkpoint::load(found->dir, pieces);
  target.commit(meta.step);
  startStep = stepsDone = meta.step;
  if (weightsOnly) {
    TESSERA_CHECK(meta.step == 0, "train_gpt: the weights-only checkpoint in {} is at step {}, not 0", found->dir,
                  meta.step);
    batches->start(nullptr, 0);
    if (isLogger()) {
      log::info(
          "train_gpt: weights from {} (a weights-only checkpoint at step 0, {}): fresh optimizer and schedule, "
          "data from the start",
          found->dir, meta.extra.count("layout") ? meta.extra.at("layout") : "?");
    }
    return true;
  }
  resumedFrom = lastCheckpoint = found->dir;
  const auto it = meta.extra.find("data_state");
  TESSERA_CHECK(it != meta.extra.end(), "train_gpt: the checkpoint in {} holds no data position", o.checkpoint.dir);
  const auto saved = data::decodeDataState(it->second);
  batches->start(&saved, startStep);
  warnScheduleChange(meta.extra);
  if (isLogger()) {
    log::info("train_gpt: resumed from {} at step {} (saved as: {})", found->dir, meta.step,
              meta.extra.count("layout") ? meta.extra.at("layout") : "?");
  }
  return true;
}

}  // namespace tessera::train
