// A run's progress log (rank 0: a line per step and a JSONL record) and its memory phases.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/common/device.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"
#include "train/trainer_state.h"

namespace tessera::train {

namespace {
// The step of a {"event": "step", "step": N, ...} record, else -1 (other records).
int64_t stepOfRecord(const std::string& line) {
  if (line.find("\"event\": \"step\"") == std::string::npos) return -1;
  const auto k = line.find("\"step\": ", line.find("\"event\": \"step\"") + 16);
  if (k == std::string::npos) return -1;
  try {
    return std::stoll(line.substr(k + 8));
  } catch (const std::exception&) {
    return -1;
  }
}

// Resuming at `step`: rewrites the log at `path` (atomically) without the step records after
// `step` — the steps a run killed after its last checkpoint had logged, which the resumed run
// trains again. Returns how many were dropped (-1: no log there, nothing to keep).
int64_t keepLogUpTo(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in.good()) return -1;
  std::string kept;
  int64_t dropped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (stepOfRecord(line) > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::out | std::ios::trunc);
    out << kept;
    TESSERA_CHECK(out.good(), "train_gpt: cannot rewrite the log '{}' (through {})", path, tmp);
  }
  TESSERA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "train_gpt: cannot replace the log '{}': {}", path,
                std::strerror(errno));
  return dropped;
}

// A fresh run whose log path holds an earlier run's records: they move to <stem>.<k><ext> (the
// first free k) instead of being overwritten.
void keepEarlierLog(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec) || fs::file_size(path, ec) == 0) return;
  const fs::path p(path);
  fs::path kept;
  for (int k = 1;; ++k) {
    kept = p.parent_path() / fmt::format("{}.{}{}", p.stem().string(), k, p.extension().string());
    if (!fs::exists(kept, ec)) break;
  }
  fs::rename(p, kept, ec);
  TESSERA_CHECK(!ec, "train_gpt: the log '{}' holds an earlier run's records and cannot be moved to '{}': {}", path,
                kept.string(), ec.message());
  log::info("train_gpt: the log {} held an earlier run's records: kept as {}", path, kept.string());
}

std::string jsonNumber(double x) { return x < 0 ? "null" : fmt::format("{:.6g}", x); }
// A value that may be NaN or infinite: JSON has no such numbers, so null (the record says why).
std::string jsonFinite(double x) { return std::isfinite(x) ? fmt::format("{:.9g}", x) : "null"; }
// The step's routing for an MoE model (empty for a dense one): the worst layer's load spread, drops,
// the balance and z losses where their coefficients are set.
std::string moeJson(const StepReport& r) {
  if (r.moeLoadMax < 0) return "";
  return fmt::format(
      ", \"moe_load_max_over_mean\": {:.4f}, \"moe_load_min_over_mean\": {:.4f}, \"moe_dropped_frac\": {:.6f}, "
      "\"moe_aux_loss\": {}, \"moe_z_loss\": {}",
      r.moeLoadMax, r.moeLoadMin, r.moeDropped, jsonFinite(r.moeAuxLoss), jsonFinite(r.moeZLoss));
}
std::string moeText(const StepReport& r, const models::MoeConfig& m) {
  if (r.moeLoadMax < 0) return "";
  return fmt::format(" | moe: load max/mean {:.2f}, min/mean {:.2f}{}{}{}", r.moeLoadMax, r.moeLoadMin,
                     m.capacityFactor > 0 ? fmt::format(", dropped {:.2f}%", 100 * r.moeDropped) : "",
                     m.auxLossCoef > 0 ? fmt::format(", aux {:.4f}", r.moeAuxLoss) : "",
                     m.zLossCoef > 0 ? fmt::format(", z {:.3f}", r.moeZLoss) : "");
}
// `s` as a JSON string literal.
std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}
}  // namespace

void Trainer::State::openLog() {
  logOpened = true;
  if (!isLogger()) return;
  log::info("train_gpt: {} on {} rank{} ({}); model {}; {}", o.describe(), ctx.world->size(),
            ctx.world->size() == 1 ? "" : "s", ctx.deviceDescription, o.model.cfg.describe(), par.partition.describe());
  std::istringstream lines(batches->describe());
  for (std::string line; std::getline(lines, line);) log::info("train_gpt: data: {}", line);
  if (o.logging.jsonl.empty()) return;
  if (startStep == 0) keepEarlierLog(o.logging.jsonl);
  const int64_t dropped = startStep > 0 ? keepLogUpTo(o.logging.jsonl, startStep) : -1;
  jsonl.open(o.logging.jsonl, std::ios::out | (startStep > 0 ? std::ios::app : std::ios::trunc));
  TESSERA_CHECK(jsonl.good(), "train_gpt: cannot write the log '{}'", o.logging.jsonl);
  if (startStep > 0) {
    jsonl << fmt::format("{{\"event\": \"resume\", \"step\": {}, \"checkpoint\": {}, \"dropped_records\": {}}}",
                         startStep, jsonString(resumedFrom), std::max<int64_t>(dropped, 0))
          << std::endl;
    if (dropped > 0) {
      log::info("train_gpt: log {}: dropped {} step records after the checkpoint's step {}", o.logging.jsonl, dropped,
                startStep);
    }
  }
  jsonl << fmt::format(
               "{{\"event\": \"config\", \"world\": {}, \"dp\": {}, \"pp\": {}, \"tp\": {}, \"dp_mode\": \"{}\", "
               "\"micro_batches\": {}, \"schedule\": \"{}\", \"chunks\": {}, \"sequence_parallel\": {}, \"d\": {}, "
               "\"layers\": {}, \"heads\": {}, \"vocab\": {}, \"seq_len\": {}, \"batch\": {}, \"precision\": \"{}\", "
               "\"seed\": {}, \"params\": {}, \"device\": \"{}\", \"data\": {}, \"model\": {}, \"lr\": {}, "
               "\"recompute\": \"{}\"}}",
               ctx.world->size(), o.parallel.dp, o.parallel.pp, o.parallel.tp, toString(o.parallel.dpMode),
               o.parallel.microBatches, pipeline::scheduleName(o.parallel.schedule), o.parallel.chunks,
               o.parallel.sequenceParallel, o.model.cfg.d, o.model.cfg.layers, o.model.cfg.heads, o.model.cfg.vocab,
               o.model.cfg.seqLen, o.optim.batch, toString(o.precision.precision), o.seed,
               models::paramCount(o.model.cfg), ctx.deviceDescription, jsonString(o.data.data),
               jsonString(o.model.cfg.describe()), jsonString(optim::describe(o.optim.lr)),
               nn::toString(o.precision.recompute))
        << std::endl;
}

void Trainer::State::logStep(const StepReport& r) {
  if (!isLogger()) return;
  if (!dpDescribed) {  // DDP's buckets are built in the first step
    dpDescribed = true;
    if (const auto d = par.dp->describe(); !d.empty()) log::info("train_gpt: {}", d);
  }
  log::info(
      "step {}/{} loss {:.6f}{} | lr {:.3g} | grad norm {:.4f} | {:.0f} tok/s{} | step {:.1f} ms: compute ~{:.1f}, "
      "exposed dp comm ~{}, bubble ~{:.1f}, optimizer {:.1f} | peak {:.2f} GiB{}{}{}{}",
      r.step, o.optim.steps, r.loss, r.validLoss >= 0 ? fmt::format(" | valid loss {:.6f}", r.validLoss) : "", r.lr,
      r.gradNorm, r.tokensPerS, r.mfu >= 0 ? fmt::format(" | MFU {:.1f}%", 100 * r.mfu) : "", r.stepMs, r.computeMsEst,
      r.dpSyncMsEst >= 0 ? fmt::format("{:.1f}", r.dpSyncMsEst) : "n/a", r.bubbleMsEst, r.optimizerMs, r.peakMemGiB,
      r.memStepStartGiB >= 0
          ? fmt::format(" (allocated {:.2f} at start, {:.2f} before backward; peaks: forward {:.2f}, backward "
                        "{:.2f}, optimizer {:.2f})",
                        r.memStepStartGiB, r.memBeforeBackwardGiB, r.memPeakForwardGiB, r.memPeakBackwardGiB,
                        r.memPeakOptimizerGiB)
          : "",
      r.fp8Values >= 0
          ? fmt::format(" | fp8: {} values, {} underflowed, {} saturated", r.fp8Values, r.fp8Underflows, r.fp8Saturated)
          : "",
      moeText(r, o.model.cfg.moe),
      r.skipped     ? " | NOT FINITE: update skipped"
      : r.nonFinite ? " | NOT FINITE"
                    : "");
  if (!jsonl.is_open()) return;
  jsonl << fmt::format(
               "{{\"event\": \"step\", \"step\": {}, \"loss\": {}, \"valid_loss\": {}, \"lr\": {:.9g}, "
               "\"grad_norm\": {}, \"step_ms\": {:.3f}, "
               "\"tokens_per_s\": {:.1f}, \"mfu\": {}, \"peak_mem_gib\": {:.4f}, \"pipeline_ms\": {:.3f}, "
               "\"optimizer_ms\": {:.3f}, \"compute_ms_est\": {:.3f}, \"dp_sync_ms_est\": {}, "
               "\"bubble_ms_est\": {:.3f}, \"wall_s\": {:.3f}{}{}{}{}}}",
               r.step, jsonFinite(r.loss), r.validLoss >= 0 ? jsonFinite(r.validLoss) : "null", r.lr,
               jsonFinite(r.gradNorm), r.stepMs, r.tokensPerS, jsonNumber(r.mfu), r.peakMemGiB, r.pipelineMs,
               r.optimizerMs, r.computeMsEst, jsonNumber(r.dpSyncMsEst), r.bubbleMsEst,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - runStart).count(),
               r.fp8Values >= 0 ? fmt::format(", \"fp8_values\": {}, \"fp8_underflows\": {}, \"fp8_saturated\": {}",
                                              r.fp8Values, r.fp8Underflows, r.fp8Saturated)
                                : "",
               r.memStepStartGiB >= 0
                   ? fmt::format(", \"mem_step_start_gib\": {:.4f}, \"mem_before_backward_gib\": {:.4f}, "
                                 "\"mem_peak_forward_gib\": {:.4f}, \"mem_peak_backward_gib\": {:.4f}, "
                                 "\"mem_peak_optimizer_gib\": {:.4f}",
                                 r.memStepStartGiB, r.memBeforeBackwardGiB, r.memPeakForwardGiB, r.memPeakBackwardGiB,
                                 r.memPeakOptimizerGiB)
                   : "",
               moeJson(r), r.nonFinite ? fmt::format(", \"nonfinite\": true, \"skipped\": {}", r.skipped) : "")
        << std::endl;
}

void Trainer::State::logSummary(const std::vector<StepReport>& steps) {
  if (!isLogger() || steps.empty()) return;
  double ms = 0, mfu = 0, valid = -1;
  int withMfu = 0, skipped = 0;
  for (const auto& r : steps) {
    ms += r.stepMs;
    if (r.mfu >= 0) mfu += r.mfu, ++withMfu;
    if (r.validLoss >= 0) valid = r.validLoss;
    skipped += r.skipped ? 1 : 0;
  }
  const auto& last = steps.back();
  const double tokens = static_cast<double>(steps.size()) * o.optim.batch * o.model.cfg.seqLen;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - runStart).count();
  const double tps = ms > 0 ? tokens / (ms / 1e3) : 0;
  const std::string saved = lastCheckpoint != resumedFrom ? lastCheckpoint : "";  // saved by this run
  log::info("train_gpt: done: steps {}..{} of {} in {:.1f} s; final loss {:.4f}{}; {:.0f} tokens at {:.0f} tok/s{}{}",
            steps.front().step, last.step, o.optim.steps, wall, last.loss,
            valid >= 0 ? fmt::format(", validation loss {:.4f}", valid) : "", tokens, tps,
            withMfu ? fmt::format(", MFU {:.1f}%", 100 * mfu / withMfu) : "",
            skipped ? fmt::format("; {} update(s) skipped (not finite)", skipped) : "");
  log::info("train_gpt: files: log {}; checkpoint {}{}", o.logging.jsonl.empty() ? "none" : o.logging.jsonl,
            saved.empty() ? "none" : saved,
            o.checkpoint.saveHfAtEnd.empty() ? "" : fmt::format("; Hugging Face export {}", o.checkpoint.saveHfAtEnd));
  if (!o.logging.jsonl.empty()) {
    log::info("train_gpt: plot: tools/plot_run.py {} -o {}.png", o.logging.jsonl,
              std::filesystem::path(o.logging.jsonl).replace_extension().string());
  }
  if (!jsonl.is_open()) return;
  jsonl << fmt::format(
               "{{\"event\": \"summary\", \"first_step\": {}, \"last_step\": {}, \"steps\": {}, \"loss\": {}, "
               "\"valid_loss\": {}, \"tokens\": {:.0f}, \"tokens_per_s\": {:.1f}, \"mfu\": {}, \"wall_s\": {:.3f}, "
               "\"skipped\": {}, \"checkpoint\": {}}}",
               steps.front().step, last.step, o.optim.steps, jsonFinite(last.loss),
               valid >= 0 ? jsonFinite(valid) : "null", tokens, tps, withMfu ? jsonNumber(mfu / withMfu) : "null", wall,
               skipped, saved.empty() ? "null" : jsonString(saved))
        << std::endl;
}

void Trainer::State::startTrainingMemory() {
  if (!device.is_cuda()) return;
  // Every rank builds the unsharded fp32 model on its device before FSDP shards it: on llama3-8b
  // that peak (about 60 GiB) was all the steps reported before this reset.
  auto built = at::full({1}, peakMemoryGiB(device), at::TensorOptions().dtype(at::kFloat).device(device));
  ctx.world->allReduce(built, ReduceOp::Max)->wait();
  if (isLogger())
    log::info("train_gpt: building the model peaked at {:.2f} GiB (fullest rank); the steps' peak starts now",
              built.item<double>());
  resetPeakMemory(device);
  runPeakGiB = 0;
}

bool Trainer::State::measureMemory() const { return o.logging.breakdown && device.is_cuda(); }

double Trainer::State::endMemoryPhase() {
  const double p = peakMemoryGiB(device);
  runPeakGiB = std::max(runPeakGiB, p);
  resetPeakMemory(device);
  return p;
}

}  // namespace tessera::train
