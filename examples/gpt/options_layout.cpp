// train_gpt's options once parsed: the layout resolved against the world size (its checks across
// dp, pp, cp, tp, the batch and the model), the resolved config as TOML, and the one-line
// description of the run. The command line itself is options.cpp's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "options.h"
#include "options_flags.h"

namespace tessera::gpt {

namespace {
std::string cpFactor(const TrainOptions& o) { return o.cp > 1 ? fmt::format(" x cp {}", o.cp) : ""; }
}  // namespace

void resolveLayout(TrainOptions& o, int world) {
  USAGE_CHECK(o.pp >= 1 && o.tp >= 1 && o.cp >= 1, "train_gpt: --pp, --cp and --tp must be >= 1 (pp {}, cp {}, tp {})",
              o.pp, o.cp, o.tp);
  const std::string cpText = cpFactor(o);
  if (o.dp == 0) {
    USAGE_CHECK(world % (o.pp * o.cp * o.tp) == 0, "train_gpt: the world of {} ranks is not divisible by pp {}{} x tp {}",
                world, o.pp, cpText, o.tp);
    o.dp = world / (o.pp * o.cp * o.tp);
  }
  USAGE_CHECK(o.dp * o.pp * o.cp * o.tp == world, "train_gpt: dp {} x pp {}{} x tp {} = {} ranks, but the world has {}",
              o.dp, o.pp, cpText, o.tp, o.dp * o.pp * o.cp * o.tp, world);
  USAGE_CHECK(o.cfg.seqLen % (2 * o.cp) == 0,
              "train_gpt: --cp {}: the sequence length {} is not divisible by 2 x cp = {} (each cp rank holds two "
              "chunks of equal length)",
              o.cp, o.cfg.seqLen, 2 * o.cp);
  USAGE_CHECK(!o.sequenceParallel || (o.cfg.seqLen / o.cp) % o.tp == 0,
              "train_gpt: --sp with --cp {}: each cp rank's {} positions are not divisible by tp = {}", o.cp,
              o.cfg.seqLen / o.cp, o.tp);
  if (o.microBatches == 0) o.microBatches = o.pp > 1 ? 2 * o.pp : 1;
  if (o.batch == 0) o.batch = 8 * o.dp;
  USAGE_CHECK(o.batch % o.dp == 0, "train_gpt: --batch {} is not divisible by dp {}", o.batch, o.dp);
  USAGE_CHECK((o.batch / o.dp) % o.microBatches == 0,
              "train_gpt: the per-replica batch {} (batch {} / dp {}) is not divisible into {} micro-batches",
              o.batch / o.dp, o.batch, o.dp, o.microBatches);
  const auto& c = o.cfg;
  USAGE_CHECK(c.heads % o.tp == 0, "train_gpt: heads = {} is not divisible by tp = {}", c.heads, o.tp);
  USAGE_CHECK(c.arch != models::Arch::Llama || c.kvH() % o.tp == 0 || o.tp % c.kvH() == 0,
              "train_gpt: kv heads = {} and tp = {}: one must divide the other (kv heads split over tp, or each "
              "replicated on tp / kv heads ranks)",
              c.kvH(), o.tp);
  USAGE_CHECK(c.ffnSize() % o.tp == 0, "train_gpt: the FFN size {} is not divisible by tp = {}", c.ffnSize(), o.tp);
  USAGE_CHECK(c.vocab % o.tp == 0, "train_gpt: the vocabulary {} is not divisible by tp = {} (vocab-parallel)",
              c.vocab, o.tp);
  USAGE_CHECK(c.layers >= o.pp * o.chunks, "train_gpt: {} layers cannot fill pp {} x {} chunk(s) = {} stages",
              c.layers, o.pp, o.chunks, o.pp * o.chunks);
  if (!o.layersPerStage.empty()) {
    int64_t sum = 0;
    for (const int n : o.layersPerStage) sum += n;
    USAGE_CHECK(static_cast<int>(o.layersPerStage.size()) == o.pp * o.chunks && sum == c.layers,
                "train_gpt: --layers-per-stage {} needs pp {} x {} chunk(s) = {} entries summing to the {} layers",
                fmt::join(o.layersPerStage, ","), o.pp, o.chunks, o.pp * o.chunks, c.layers);
  }
  USAGE_CHECK(!(o.dpMode == DpMode::Fsdp && o.schedule == pipeline::ScheduleKind::Interleaved1F1B),
              "train_gpt: --dp-mode fsdp with --schedule interleaved is not supported (FSDP reduces a unit's "
              "gradients in the last backward that runs it, which interleaving splits across chunks); use 1f1b or "
              "gpipe");
  USAGE_CHECK(!(o.dpMode == DpMode::Fsdp && o.schedule == pipeline::ScheduleKind::ZeroBubbleH1),
              "train_gpt: --dp-mode fsdp with --schedule zb-h1 is not supported (FSDP reduce-scatters a unit's "
              "gradients in its backward, before the deferred weight-gradient passes); use --dp-mode ddp or 1f1b");
}

std::string configToml(const TrainOptions& o) {
  std::string out = "# train_gpt's options: train_gpt --config FILE runs them again (flags given beside it win)\n";
  std::string group;
  for (const auto& f : flagTable(false)) {
    const std::string v = f.get ? f.get(o) : "";
    if (v.empty()) continue;
    if (f.group != group) out += fmt::format("# {}\n", group = f.group);
    out += fmt::format("{} = {}\n", f.key(), v);
  }
  return out;
}

bool usesFusedWgrad(const TrainOptions& o) { return o.fusedWgrad && o.dpMode == DpMode::Ddp; }

bool gathersEmbeddingRows(const TrainOptions& o, const models::ModelConfig& c) {
  const bool asked = o.dpMode == DpMode::Fsdp ? o.fsdpEmbRows : o.embGradGather && usesFusedWgrad(o);
  return asked && o.dp > 1 && c.tiedEmbeddings && o.pp == 1 && o.chunks == 1;
}

std::string describe(const TrainOptions& o) {
  const auto& ov = o.overlap;
  const bool overlapSet = ov.forwardChunks > 1 || ov.smCarveout > 0 || ov.ring;
  return fmt::format("dp {} ({}) x pp {}{} x tp {}{}; {} micro-batches, schedule {}{}; batch {} x T {}; {}{}{}; {} steps; {}{}{}",
                     o.dp, toString(o.dpMode), o.pp, cpFactor(o), o.tp,
                     o.sequenceParallel ? " +sp" : "", o.microBatches,
                     pipeline::scheduleName(o.schedule),
                     o.chunks > 1                ? fmt::format(" ({} chunks)", o.chunks)
                     : o.extraWarmup > 0 ? fmt::format(" (+{} warm-up forwards)", o.extraWarmup)
                                         : "",
                     o.batch, o.cfg.seqLen, toString(o.precision),
                     usesFusedWgrad(o) ? ", weight gradients summed in the GEMM" : "",
                     o.fusedKernels ? ", fused kernels" : "", o.steps, optim::describe(o.lr),
                     o.recompute != nn::Recompute::None ? fmt::format("; recompute {}", nn::toString(o.recompute)) : "",
                     overlapSet ? fmt::format("; overlap: {} forward pieces, {} SMs kept free{}", ov.forwardChunks,
                                              ov.smCarveout, ov.ring ? ", ring" : "")
                                : "");
}

}  // namespace tessera::gpt
