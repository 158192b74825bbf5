// A parsed Config resolved against the world size (its checks across dp, pp, cp, tp, the batch and
// the model), written back as TOML, described in one line; the composer's choices that follow.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/train/config.h"
#include "train/flags.h"

namespace tessera::train {

namespace {
std::string cpFactor(const Config& o) { return o.parallel.cp > 1 ? fmt::format(" x cp {}", o.parallel.cp) : ""; }
}  // namespace

void Config::resolve(int world) {
  Config& o = *this;
  USAGE_CHECK(o.parallel.pp >= 1 && o.parallel.tp >= 1 && o.parallel.cp >= 1, "train_gpt: --pp, --cp and --tp must be >= 1 (pp {}, cp {}, tp {})",
              o.parallel.pp, o.parallel.cp, o.parallel.tp);
  const std::string cpText = cpFactor(o);
  if (o.parallel.dp == 0) {
    USAGE_CHECK(world % (o.parallel.pp * o.parallel.cp * o.parallel.tp) == 0, "train_gpt: the world of {} ranks is not divisible by pp {}{} x tp {}",
                world, o.parallel.pp, cpText, o.parallel.tp);
    o.parallel.dp = world / (o.parallel.pp * o.parallel.cp * o.parallel.tp);
  }
  USAGE_CHECK(o.parallel.dp * o.parallel.pp * o.parallel.cp * o.parallel.tp == world, "train_gpt: dp {} x pp {}{} x tp {} = {} ranks, but the world has {}",
              o.parallel.dp, o.parallel.pp, cpText, o.parallel.tp, o.parallel.dp * o.parallel.pp * o.parallel.cp * o.parallel.tp, world);
  USAGE_CHECK(o.model.cfg.seqLen % (2 * o.parallel.cp) == 0,
              "train_gpt: --cp {}: the sequence length {} is not divisible by 2 x cp = {} (each cp rank holds two "
              "chunks of equal length)",
              o.parallel.cp, o.model.cfg.seqLen, 2 * o.parallel.cp);
  USAGE_CHECK(!o.parallel.sequenceParallel || (o.model.cfg.seqLen / o.parallel.cp) % o.parallel.tp == 0,
              "train_gpt: --sp with --cp {}: each cp rank's {} positions are not divisible by tp = {}", o.parallel.cp,
              o.model.cfg.seqLen / o.parallel.cp, o.parallel.tp);
  if (o.parallel.microBatches == 0) o.parallel.microBatches = o.parallel.pp > 1 ? 2 * o.parallel.pp : 1;
  if (o.optim.batch == 0) o.optim.batch = 8 * o.parallel.dp;
  USAGE_CHECK(o.optim.batch % o.parallel.dp == 0, "train_gpt: --batch {} is not divisible by dp {}", o.optim.batch, o.parallel.dp);
  USAGE_CHECK((o.optim.batch / o.parallel.dp) % o.parallel.microBatches == 0,
              "train_gpt: the per-replica batch {} (batch {} / dp {}) is not divisible into {} micro-batches",
              o.optim.batch / o.parallel.dp, o.optim.batch, o.parallel.dp, o.parallel.microBatches);
  const auto& c = o.model.cfg;
  USAGE_CHECK(c.heads % o.parallel.tp == 0, "train_gpt: heads = {} is not divisible by tp = {}", c.heads, o.parallel.tp);
  USAGE_CHECK(c.arch != models::Arch::Llama || c.kvH() % o.parallel.tp == 0 || o.parallel.tp % c.kvH() == 0,
              "train_gpt: kv heads = {} and tp = {}: one must divide the other (kv heads split over tp, or each "
              "replicated on tp / kv heads ranks)",
              c.kvH(), o.parallel.tp);
  USAGE_CHECK(c.ffnSize() % o.parallel.tp == 0, "train_gpt: the FFN size {} is not divisible by tp = {}", c.ffnSize(), o.parallel.tp);
  USAGE_CHECK(c.vocab % o.parallel.tp == 0, "train_gpt: the vocabulary {} is not divisible by tp = {} (vocab-parallel)",
              c.vocab, o.parallel.tp);
  USAGE_CHECK(c.layers >= o.parallel.pp * o.parallel.chunks, "train_gpt: {} layers cannot fill pp {} x {} chunk(s) = {} stages",
              c.layers, o.parallel.pp, o.parallel.chunks, o.parallel.pp * o.parallel.chunks);
  if (!o.parallel.layersPerStage.empty()) {
    int64_t sum = 0;
    for (const int n : o.parallel.layersPerStage) sum += n;
    USAGE_CHECK(static_cast<int>(o.parallel.layersPerStage.size()) == o.parallel.pp * o.parallel.chunks && sum == c.layers,
                "train_gpt: --layers-per-stage {} needs pp {} x {} chunk(s) = {} entries summing to the {} layers",
                fmt::join(o.parallel.layersPerStage, ","), o.parallel.pp, o.parallel.chunks, o.parallel.pp * o.parallel.chunks, c.layers);
  }
  USAGE_CHECK(!(o.parallel.dpMode == DpMode::Fsdp && o.parallel.schedule == pipeline::ScheduleKind::Interleaved1F1B),
              "train_gpt: --dp-mode fsdp with --schedule interleaved is not supported (FSDP reduces a unit's "
              "gradients in the last backward that runs it, which interleaving splits across chunks); use 1f1b or "
              "gpipe");
  USAGE_CHECK(!(o.parallel.dpMode == DpMode::Fsdp && o.parallel.schedule == pipeline::ScheduleKind::ZeroBubbleH1),
              "train_gpt: --dp-mode fsdp with --schedule zb-h1 is not supported (FSDP reduce-scatters a unit's "
              "gradients in its backward, before the deferred weight-gradient passes); use --dp-mode ddp or 1f1b");
}

std::string Config::toToml() const {
  const Config& o = *this;
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

bool usesFusedWgrad(const Config& o) { return o.precision.fusedWgrad && o.parallel.dpMode == DpMode::Ddp; }

bool gathersEmbeddingRows(const Config& o) {
  const auto& c = o.model.cfg;
  const bool asked = o.parallel.dpMode == DpMode::Fsdp ? o.parallel.fsdpEmbRows : o.parallel.embGradGather && usesFusedWgrad(o);
  return asked && o.parallel.dp > 1 && c.tiedEmbeddings && o.parallel.pp == 1 && o.parallel.chunks == 1;
}

std::string Config::describe() const {
  const Config& o = *this;
  const auto& ov = o.parallel.overlap;
  const bool overlapSet = ov.forwardChunks > 1 || ov.smCarveout > 0 || ov.ring;
  return fmt::format("dp {} ({}) x pp {}{} x tp {}{}; {} micro-batches, schedule {}{}; batch {} x T {}; {}{}{}; {} steps; {}{}{}",
                     o.parallel.dp, toString(o.parallel.dpMode), o.parallel.pp, cpFactor(o), o.parallel.tp,
                     o.parallel.sequenceParallel ? " +sp" : "", o.parallel.microBatches,
                     pipeline::scheduleName(o.parallel.schedule),
                     o.parallel.chunks > 1                ? fmt::format(" ({} chunks)", o.parallel.chunks)
                     : o.parallel.extraWarmup > 0 ? fmt::format(" (+{} warm-up forwards)", o.parallel.extraWarmup)
                                         : "",
                     o.optim.batch, o.model.cfg.seqLen, toString(o.precision.precision),
                     usesFusedWgrad(o) ? ", weight gradients summed in the GEMM" : "",
                     o.precision.fusedKernels ? ", fused kernels" : "", o.optim.steps, optim::describe(o.optim.lr),
                     o.precision.recompute != nn::Recompute::None ? fmt::format("; recompute {}", nn::toString(o.precision.recompute)) : "",
                     overlapSet ? fmt::format("; overlap: {} forward pieces, {} SMs kept free{}", ov.forwardChunks,
                                              ov.smCarveout, ov.ring ? ", ring" : "")
                                : "");
}

}  // namespace tessera::train
