// train_gpt's progress log (rank 0: a line per step and a JSONL record) and checkpoints.
#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "common/device.h"
#include "common/error.h"
#include "common/log.h"
#include "trainer_state.h"

namespace tessera::gpt {

namespace {
std::string jsonNumber(double x) { return x < 0 ? "null" : fmt::format("{:.6g}", x); }
}  // namespace

void Trainer::State::openLog() {
  if (!isLogger()) return;
  log::info("train_gpt: {} on {} ranks ({}); model {}; {}", describe(o), ctx.world->size(), ctx.deviceDescription,
            o.cfg.describe(), part.describe());
  if (o.logJsonl.empty()) return;
  jsonl.open(o.logJsonl, std::ios::out | std::ios::trunc);
  TESSERA_CHECK(jsonl.good(), "train_gpt: cannot write the log '{}'", o.logJsonl);
  jsonl << fmt::format(
               "{{\"event\": \"config\", \"world\": {}, \"dp\": {}, \"pp\": {}, \"tp\": {}, \"dp_mode\": \"{}\", "
               "\"micro_batches\": {}, \"schedule\": \"{}\", \"chunks\": {}, \"sequence_parallel\": {}, \"d\": {}, "
               "\"layers\": {}, \"heads\": {}, \"vocab\": {}, \"seq_len\": {}, \"batch\": {}, \"precision\": \"{}\", "
               "\"seed\": {}, \"params\": {}, \"device\": \"{}\"}}",
               ctx.world->size(), o.dp, o.pp, o.tp, o.dpMode, o.microBatches, o.schedule, o.chunks,
               o.sequenceParallel, o.cfg.d, o.cfg.layers, o.cfg.heads, o.cfg.vocab, o.cfg.seqLen, o.batch,
               o.precision, o.seed, paramCount(o.cfg), ctx.deviceDescription)
        << std::endl;
}

void Trainer::State::logStep(const StepReport& r) {
  if (!isLogger()) return;
  log::info(
      "step {}/{} loss {:.6f} | grad norm {:.4f} | {:.0f} tok/s{} | step {:.1f} ms: compute ~{:.1f}, exposed dp comm "
      "~{}, bubble ~{:.1f}, optimizer {:.1f} | peak {:.2f} GiB",
      r.step, o.steps, r.loss, r.gradNorm, r.tokensPerS, r.mfu >= 0 ? fmt::format(" | MFU {:.1f}%", 100 * r.mfu) : "",
      r.stepMs, r.computeMsEst, r.dpSyncMsEst >= 0 ? fmt::format("{:.1f}", r.dpSyncMsEst) : "n/a", r.bubbleMsEst,
      r.optimizerMs, r.peakMemGiB);
  if (!jsonl.is_open()) return;
  jsonl << fmt::format(
               "{{\"event\": \"step\", \"step\": {}, \"loss\": {:.9g}, \"grad_norm\": {:.9g}, \"step_ms\": {:.3f}, "
               "\"tokens_per_s\": {:.1f}, \"mfu\": {}, \"peak_mem_gib\": {:.4f}, \"pipeline_ms\": {:.3f}, "
               "\"optimizer_ms\": {:.3f}, \"compute_ms_est\": {:.3f}, \"dp_sync_ms_est\": {}, "
               "\"bubble_ms_est\": {:.3f}}}",
               r.step, r.loss, r.gradNorm, r.stepMs, r.tokensPerS, jsonNumber(r.mfu), r.peakMemGiB, r.pipelineMs,
               r.optimizerMs, r.computeMsEst, jsonNumber(r.dpSyncMsEst), r.bubbleMsEst)
        << std::endl;
}

namespace {
// The optimizer state's view matching a parameter piece (a view of `param`).
at::Tensor stateView(const at::Tensor& piece, const at::Tensor& param, const at::Tensor& state) {
  return state.as_strided(piece.sizes(), piece.strides(),
                          state.storage_offset() + (piece.storage_offset() - param.storage_offset()));
}

std::vector<checkpoint::Piece> trainingPieces(const std::vector<GptChunk>& chunks, const ParamAdamW& adam) {
  std::vector<checkpoint::Piece> out;
  for (auto c : chunks) {  // a holder copy: pieces() is not const
    for (auto& p : c->pieces()) out.push_back(p);
  }
  const size_t nParams = out.size();
  const auto& params = adam.params();
  for (size_t i = 0; i < nParams; ++i) {
    const auto piece = out[i];
    size_t k = 0;
    while (k < params.size() && !piece.local.is_alias_of(params[k])) ++k;
    TESSERA_CHECK(k < params.size(), "train_gpt: checkpoint piece '{}' is no parameter's view", piece.name);
    for (const auto& [prefix, state] : {std::make_pair("optim.exp_avg.", &adam.expAvg()),
                                        std::make_pair("optim.exp_avg_sq.", &adam.expAvgSq())}) {
      out.push_back({prefix + piece.name, piece.globalShape, piece.offset,
                     stateView(piece.local, params[k], (*state)[k])});
    }
  }
  return out;
}
}  // namespace

void Trainer::State::saveCheckpoint(int64_t step) {
  TESSERA_CHECK(adam, "train_gpt: checkpoints of --dp-mode fsdp runs are not implemented yet (use ddp)");
  auto pieces = trainingPieces(chunks, *adam);
  synchronizeDevice(device);
  checkpoint::save(o.checkpointDir, pieces, *ctx.world, step, {{"layout", describe(o)}, {"data_position", std::to_string(step)}});
  if (isLogger()) log::info("train_gpt: checkpoint of step {} saved to {}", step, o.checkpointDir);
}

bool Trainer::State::loadCheckpoint() {
  if (o.checkpointDir.empty() || !std::filesystem::exists(std::filesystem::path(o.checkpointDir) / "metadata.pt")) {
    return false;
  }
  TESSERA_CHECK(adam, "train_gpt: checkpoints of --dp-mode fsdp runs are not implemented yet (use ddp)");
  auto pieces = trainingPieces(chunks, *adam);
  at::NoGradGuard ng;
  const auto meta = checkpoint::load(o.checkpointDir, pieces);
  startStep = meta.step;
  adam->setSteps(meta.step);
  if (isLogger()) {
    log::info("train_gpt: resumed from {} at step {} (saved as: {})", o.checkpointDir, meta.step,
              meta.extra.count("layout") ? meta.extra.at("layout") : "?");
  }
  return true;
}

}  // namespace tessera::gpt
