// train_gpt's checkpoints (src/checkpoint): every parameter under the unsharded model's name
// (tp::blockPieces & co. place this rank's TP shard in the full tensor), and AdamW's exp_avg /
// exp_avg_sq in the same boxes ("optim.exp_avg.<name>", "optim.exp_avg_sq.<name>"), so a
// checkpoint loads into any dp / pp / tp layout and either data-parallel mode.
// - DDP: the pieces are views of the parameters and of optim::AdamW's state.
// - FSDP: each unit's flat master / exp_avg / exp_avg_sq shards are all-gathered over dp into
//   full fp32 flat buffers (collective over dp), and the pieces are views of those, in the boxes
//   the parameters' pieces have (worked out while the units are gathered); on load the pieces
//   fill fresh full buffers and each rank keeps its shard.
// Saving is collective over the world (checkpoint::save); replicas write once.
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <functional>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "common/device.h"
#include "common/error.h"
#include "common/log.h"
#include "models/config_json.h"
#include "trainer_state.h"

namespace tessera::gpt {

namespace {
// `local` (a view of `param`) re-aimed at the same elements of `base`, whose element
// `baseOffset` corresponds to param's first element.
at::Tensor sameBox(const at::Tensor& local, const at::Tensor& param, const at::Tensor& base, int64_t baseOffset) {
  return base.as_strided(local.sizes(), local.strides(),
                         base.storage_offset() + baseOffset + (local.storage_offset() - param.storage_offset()));
}

// (piece, index of its parameter in `params`, what: 0 value, 1 exp_avg, 2 exp_avg_sq) -> tensor.
using ViewFn = std::function<at::Tensor(const checkpoint::Piece&, size_t, int)>;

// FSDP: per unit, full flat buffers [paddedNumel] of master, exp_avg, exp_avg_sq, and where each
// parameter starts in them.
struct FlatFull {
  std::vector<std::array<at::Tensor, 3>> flat;  // per unit
  std::map<std::string, std::pair<size_t, int64_t>> where;  // param name -> (unit, offset)
};

FlatFull fsdpFull(FullyShardedDataParallel& fsdp, const ShardedAdamW& adam, bool gather) {
  FlatFull f;
  const auto sd = adam.stateDict();
  const auto& dp = fsdp.shardGroup();
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const auto& lay = fsdp.layout(u);
    for (const auto& e : lay.entries) f.where[e.name] = {u, e.offset};
    const auto opts = fsdp.masterShard(u).options();
    std::array<at::Tensor, 3> full;
    int i = 0;
    for (const auto& shard : {fsdp.masterShard(u), sd.at(fsdp.unitName(u) + ".exp_avg"),
                              sd.at(fsdp.unitName(u) + ".exp_avg_sq")}) {
      auto& out = full[i++];
      out = at::zeros({lay.paddedNumel}, opts);
      if (!gather) continue;
      auto mine = at::zeros({lay.shardNumel}, opts);
      mine.narrow(0, 0, shard.numel()).copy_(shard);
      if (dp->size() == 1) {
        out.copy_(mine);
      } else {
        dp->allGather(out, mine)->wait();
      }
    }
    f.flat.push_back(full);
  }
  return f;
}

// While alive (FSDP): every unit gathered, so the parameters have storage to take the pieces'
// views of (their values are not read: the pieces are re-aimed at the full buffers, fsdpView).
class Unsharded {
 public:
  explicit Unsharded(FullyShardedDataParallel& f) : f_(f) { f_.unshardAll(); }
  ~Unsharded() { f_.reshardAll(); }
  Unsharded(const Unsharded&) = delete;

 private:
  FullyShardedDataParallel& f_;
};

// `fsdp`: its units are gathered meanwhile (collective over dp).
std::vector<checkpoint::Piece> trainingPieces(std::vector<models::LmChunk> chunks, const std::vector<ChunkParam>& params,
                                              const ViewFn& view, FullyShardedDataParallel* fsdp) {
  std::optional<Unsharded> gathered;
  if (fsdp) gathered.emplace(*fsdp);
  std::vector<checkpoint::Piece> pieces;
  for (auto& c : chunks) {
    for (auto& p : c->pieces()) pieces.push_back(p);
  }
  std::vector<checkpoint::Piece> out;
  for (const auto& piece : pieces) {
    size_t k = 0;
    auto inside = [&](const at::Tensor& P) {  // FSDP's parameters share one storage: compare ranges too
      const int64_t o = piece.local.storage_offset();
      return piece.local.is_alias_of(P) && o >= P.storage_offset() && o < P.storage_offset() + P.numel();
    };
    while (k < params.size() && !inside(params[k].tensor)) ++k;
    TESSERA_CHECK(k < params.size(), "train_gpt: checkpoint piece '{}' is no parameter's view", piece.name);
    int what = 0;
    for (const char* prefix : {"", "optim.exp_avg.", "optim.exp_avg_sq."}) {
      out.push_back({prefix + piece.name, piece.globalShape, piece.offset, view(piece, k, what++)});
    }
  }
  return out;
}

ViewFn fsdpView(const FlatFull& f, const std::vector<ChunkParam>& params) {
  return [&f, &params](const checkpoint::Piece& piece, size_t k, int what) {
    const auto& [u, offset] = f.where.at(params[k].name);
    return sameBox(piece.local, params[k].tensor, f.flat[u][what], offset);
  };
}

// FSDP load: this rank's shard of each full flat buffer back into FSDP and the optimizer.
void keepShards(FullyShardedDataParallel& fsdp, ShardedAdamW& adam, const FlatFull& f, int64_t step) {
  auto model = fsdp.shardedStateDict();
  auto opt = adam.stateDict();
  const int r = fsdp.shardRank();
  for (size_t u = 0; u < fsdp.numUnits(); ++u) {
    const auto& lay = fsdp.layout(u);
    const auto& name = fsdp.unitName(u);
    auto shard = [&](int what, int64_t n) { return f.flat[u][what].narrow(0, r * lay.shardNumel, n); };
    model[name + ".flat_shard"] = shard(0, lay.shardNumel);
    opt[name + ".exp_avg"] = shard(1, lay.trainableInShard(r));
    opt[name + ".exp_avg_sq"] = shard(2, lay.trainableInShard(r));
  }
  opt["step"] = at::tensor(step, at::kLong);
  fsdp.loadShardedStateDict(model);
  adam.loadStateDict(opt);
}

ViewFn ddpView(const std::vector<ChunkParam>& params, const optim::AdamW& adam) {
  return [&params, &adam](const checkpoint::Piece& piece, size_t k, int what) {
    if (what == 0) return piece.local;
    const auto& state = what == 1 ? adam.expAvg()[k] : adam.expAvgSq()[k];
    return sameBox(piece.local, params[k].tensor, state, 0);
  };
}
}  // namespace

void Trainer::State::saveCheckpoint(int64_t step) {
  const auto ps = params();
  FlatFull full;
  std::vector<checkpoint::Piece> pieces;
  if (fsdp) {
    full = fsdpFull(*fsdp, *shardedAdam, /*gather=*/true);
    pieces = trainingPieces(chunks, ps, fsdpView(full, ps), fsdp.get());
  } else {
    pieces = trainingPieces(chunks, ps, ddpView(ps, *adam), nullptr);
  }
  std::map<std::string, std::string> extra{{"layout", describe(o)},
                                                 {"model", o.cfg.signature()},
                                                 {"model_config", models::configToJson(o.cfg)},
                                                 {"global_batch", std::to_string(o.batch)},
                                                 {"data_state", data::encodeDataState(batches->state())}};
  if (!hfConfig.empty()) {  // an HF export of this checkpoint keeps the imported model's other fields
    extra.emplace("hf_config", hfConfig);
    extra.emplace("hf_source", hfSource);
  }
  // The run's resolved config beside the tensors: `train_gpt --config <dir>/config.toml` runs it again.
  const std::map<std::string, std::string> files{{"config.toml", configToml(o)}};
  if (saver) {  // staged to host memory here; written and published on the saver's thread
    saver->save(o.checkpointDir, pieces, step, extra, files);
    if (isLogger()) log::info("train_gpt: checkpoint of step {} staged; writing it to {}", step, o.checkpointDir);
    return;
  }
  synchronizeDevice(device);
  checkpoint::save(o.checkpointDir, pieces, *ctx.world, step, extra, files);
  if (isLogger()) log::info("train_gpt: checkpoint of step {} saved to {}", step, o.checkpointDir);
}

void Trainer::State::adoptCheckpointBatch(const std::map<std::string, std::string>& extra, const std::string& dir) {
  const auto it = extra.find("global_batch");
  if (it == extra.end()) return;  // saved by an older train_gpt: this run's batch
  const int64_t saved = std::stoll(it->second);
  if (saved == o.batch) return;
  if (o.batchGiven) {
    if (isLogger()) {
      log::warn("train_gpt: THE GLOBAL BATCH CHANGES on resume: the checkpoint in {} was trained with {} sequences a "
                "step, this run takes {} (--batch). Steps from here on see {} sequences each.",
                dir, saved, o.batch, o.batch);
    }
    return;
  }
  const int64_t layoutDefault = o.batch;
  TESSERA_CHECK(saved % o.dp == 0 && (saved / o.dp) % o.microBatches == 0,
                "train_gpt: the checkpoint in {} was trained with a global batch of {} sequences, which dp {} x {} "
                "micro-batches cannot split; give --batch to change it",
                dir, saved, o.dp, o.microBatches);
  o.batch = saved;
  if (isLogger()) {
    log::info("train_gpt: keeping the checkpoint's global batch of {} sequences (this layout's default would be {}; "
              "--batch changes it)",
              saved, layoutDefault);
  }
}

bool Trainer::State::loadCheckpoint() {
  const auto found = o.checkpointDir.empty() ? std::nullopt : checkpoint::locate(o.checkpointDir);
  if (!found) {
    batches->start(nullptr, 0);
    return false;
  }
  // Read from where locate() found it: one look for the .old fallback, said once.
  if (*found != o.checkpointDir && isLogger()) {
    log::warn("train_gpt: {} is missing (a save was interrupted between its renames); resuming from {}",
              o.checkpointDir, *found);
  }
  at::NoGradGuard ng;
  bool weightsOnly = false;
  {  // the architecture first: a checkpoint of another model is refused before any tensor is read
    const auto saved = checkpoint::readMetadata(*found);
    const auto it = saved.extra.find("model");
    TESSERA_CHECK(it == saved.extra.end() || it->second == o.cfg.signature(),
                  "train_gpt: the checkpoint in {} is of another model:\n  checkpoint: {}\n  this run:   {}",
                  *found, it->second, o.cfg.signature());
    adoptCheckpointBatch(saved.extra, *found);
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
  const auto ps = params();
  checkpoint::Metadata meta;
  if (fsdp) {
    auto full = fsdpFull(*fsdp, *shardedAdam, /*gather=*/false);
    auto pieces = onlyWeights(trainingPieces(chunks, ps, fsdpView(full, ps), fsdp.get()));
    meta = checkpoint::load(*found, pieces);
    keepShards(*fsdp, *shardedAdam, full, meta.step);
  } else {
    auto pieces = onlyWeights(trainingPieces(chunks, ps, ddpView(ps, *adam), nullptr));
    meta = checkpoint::load(*found, pieces);
    adam->setSteps(meta.step);
  }
  startStep = meta.step;
  if (weightsOnly) {
    TESSERA_CHECK(meta.step == 0, "train_gpt: the weights-only checkpoint in {} is at step {}, not 0", *found, meta.step);
    batches->start(nullptr, 0);
    if (isLogger()) {
      log::info("train_gpt: weights from {} (a weights-only checkpoint at step 0, {}): fresh optimizer and schedule, "
                "data from the start",
                *found, meta.extra.count("layout") ? meta.extra.at("layout") : "?");
    }
    return true;
  }
  resumedFrom = *found;
  const auto it = meta.extra.find("data_state");
  TESSERA_CHECK(it != meta.extra.end(), "train_gpt: the checkpoint in {} holds no data position", o.checkpointDir);
  const auto saved = data::decodeDataState(it->second);
  batches->start(&saved, startStep);
  if (isLogger()) {
    log::info("train_gpt: resumed from {} at step {} (saved as: {})", *found, meta.step,
              meta.extra.count("layout") ? meta.extra.at("layout") : "?");
  }
  return true;
}

}  // namespace tessera::gpt
