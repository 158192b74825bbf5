// A parsed Config resolved against the world size (its checks across dp, pp, cp, tp, the batch and
// the model), written back as TOML, described in one line; the composer's choices that follow.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/train/config.h"
#include "train/flags.h"

namespace tessera::train {

namespace {
std::string cpFactor(const Config& o) { return o.parallel.cp > 1 ? fmt::format(" x cp {}", o.parallel.cp) : ""; }

void checkExperts(const Config& o) {
  const auto& p = o.parallel;
  const auto& m = o.model.cfg.moe;
  USAGE_CHECK(p.ep >= 1, "train_gpt: --ep must be >= 1, got {}", p.ep);
  USAGE_CHECK(!o.model.moeForceBalanced || m.experts > 0,
              "train_gpt: --moe-force-balanced needs a mixture-of-experts model (--num-experts; the model has none)");
  USAGE_CHECK(!o.precision.fp8Experts || m.experts > 0,
              "train_gpt: --fp8-experts needs a mixture-of-experts model (--num-experts; the model has none)");
  USAGE_CHECK(!o.precision.fp8Experts || o.precision.fp8 != fp8::Recipe::Off, "train_gpt: --fp8-experts needs --fp8");
  if (p.ep == 1) return;
  USAGE_CHECK(m.experts > 0, "train_gpt: --ep {} needs a mixture-of-experts model (--num-experts; the model has none)",
              p.ep);
  USAGE_CHECK((p.dp * p.cp) % p.ep == 0,
              "train_gpt: --ep {} must divide the data-parallel ranks dp {}{} = {} (experts split over data ranks)",
              p.ep, p.dp, cpFactor(o), p.dp * p.cp);
  USAGE_CHECK(m.experts % p.ep == 0, "train_gpt: --ep {} does not divide the {} experts", p.ep, m.experts);
}
}  // namespace

void Config::resolve(int world) {
  Config& o = *this;
  auto& p = o.parallel;
  USAGE_CHECK(p.pp >= 1 && p.tp >= 1 && p.cp >= 1, "train_gpt: --pp, --cp and --tp must be >= 1 (pp {}, cp {}, tp {})",
              p.pp, p.cp, p.tp);
  const std::string cpText = cpFactor(o);
  if (p.dp == 0) {
    USAGE_CHECK(world % (p.pp * p.cp * p.tp) == 0,
                "train_gpt: the world of {} ranks is not divisible by pp {}{} x tp {}", world, p.pp, cpText, p.tp);
    p.dp = world / (p.pp * p.cp * p.tp);
  }
  USAGE_CHECK(p.dp * p.pp * p.cp * p.tp == world, "train_gpt: dp {} x pp {}{} x tp {} = {} ranks, but the world has {}",
              p.dp, p.pp, cpText, p.tp, p.dp * p.pp * p.cp * p.tp, world);
  USAGE_CHECK(o.model.cfg.seqLen % (2 * p.cp) == 0,
              "train_gpt: --cp {}: the sequence length {} is not divisible by 2 x cp = {} (each cp rank holds two "
              "chunks of equal length)",
              p.cp, o.model.cfg.seqLen, 2 * p.cp);
  USAGE_CHECK(!p.sequenceParallel || (o.model.cfg.seqLen / p.cp) % p.tp == 0,
              "train_gpt: --sp with --cp {}: each cp rank's {} positions are not divisible by tp = {}", p.cp,
              o.model.cfg.seqLen / p.cp, p.tp);
  checkExperts(o);
  if (p.microBatches == 0) p.microBatches = p.pp > 1 ? 2 * p.pp : 1;
  if (o.optim.batch == 0) o.optim.batch = 8 * p.dp;
  const std::string batch = o.optim.batchFromCheckpoint
                                ? fmt::format("the checkpoint's global batch {} (--batch changes it)", o.optim.batch)
                                : fmt::format("--batch {}", o.optim.batch);
  USAGE_CHECK(o.optim.batch % p.dp == 0, "train_gpt: {} is not divisible by dp {}", batch, p.dp);
  USAGE_CHECK((o.optim.batch / p.dp) % p.microBatches == 0,
              "train_gpt: the per-replica batch {} ({} / dp {}) is not divisible into {} micro-batches",
              o.optim.batch / p.dp, batch, p.dp, p.microBatches);
  const auto& c = o.model.cfg;
  USAGE_CHECK(c.heads % p.tp == 0, "train_gpt: heads = {} is not divisible by tp = {}", c.heads, p.tp);
  USAGE_CHECK(c.arch != models::Arch::Llama || c.kvH() % p.tp == 0 || p.tp % c.kvH() == 0,
              "train_gpt: kv heads = {} and tp = {}: one must divide the other (kv heads split over tp, or each "
              "replicated on tp / kv heads ranks)",
              c.kvH(), p.tp);
  USAGE_CHECK(c.ffnSize() % p.tp == 0, "train_gpt: the FFN size {} is not divisible by tp = {}", c.ffnSize(), p.tp);
  USAGE_CHECK(c.vocab % p.tp == 0, "train_gpt: the vocabulary {} is not divisible by tp = {} (vocab-parallel)", c.vocab,
              p.tp);
  USAGE_CHECK(c.layers >= p.pp * p.chunks, "train_gpt: {} layers cannot fill pp {} x {} chunk(s) = {} stages", c.layers,
              p.pp, p.chunks, p.pp * p.chunks);
  if (!p.layersPerStage.empty()) {
    int64_t sum = 0;
    for (const int n : p.layersPerStage) sum += n;
    USAGE_CHECK(static_cast<int>(p.layersPerStage.size()) == p.pp * p.chunks && sum == c.layers,
                "train_gpt: --layers-per-stage {} needs pp {} x {} chunk(s) = {} entries summing to the {} layers",
                fmt::join(p.layersPerStage, ","), p.pp, p.chunks, p.pp * p.chunks, c.layers);
  }
  USAGE_CHECK(!(p.dpMode == DpMode::Fsdp && p.schedule == pipeline::ScheduleKind::Interleaved1F1B),
              "train_gpt: --dp-mode fsdp with --schedule interleaved is not supported (FSDP reduces a unit's "
              "gradients in the last backward that runs it, which interleaving splits across chunks); use 1f1b or "
              "gpipe");
  USAGE_CHECK(!(p.dpMode != DpMode::Fsdp && p.fsdpKeepGathered == OnOffAuto::On),
              "train_gpt: --fsdp-keep-gathered on needs --dp-mode fsdp (DDP's parameters are never sharded)");
  USAGE_CHECK(!(p.dpMode != DpMode::Fsdp && p.fsdpAccumulate == FsdpAccumulate::Sharded),
              "train_gpt: --fsdp-accumulate sharded needs --dp-mode fsdp (DDP's gradients are never sharded)");
  const bool zeroBubble = p.schedule == pipeline::ScheduleKind::ZeroBubbleH1 || p.schedule == pipeline::ScheduleKind::ZeroBubbleV;
  USAGE_CHECK(!(p.dpMode == DpMode::Fsdp && zeroBubble),
              "train_gpt: --dp-mode fsdp with --schedule {} is not supported (FSDP reduce-scatters a unit's "
              "gradients in its backward, before the deferred weight-gradient passes); use --dp-mode ddp or 1f1b",
              pipeline::scheduleName(p.schedule));
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

bool usesFusedWgrad(const Config& o) { return o.precision.fusedWgrad; }

bool gathersEmbeddingRows(const Config& o) {
  const auto& c = o.model.cfg;
  const auto& p = o.parallel;
  const bool asked = p.dpMode == DpMode::Fsdp ? p.fsdpEmbRows : p.embGradGather && usesFusedWgrad(o);
  return asked && p.dp > 1 && c.tiedEmbeddings && p.pp == 1 && p.chunks == 1;
}

std::string Config::describe() const {
  const Config& o = *this;
  const auto& p = o.parallel;
  const auto& ov = p.overlap;
  const bool overlapSet = ov.forwardChunks > 1 || ov.smCarveout > 0 || ov.ring;
  return fmt::format(
      "dp {} ({}) x pp {}{} x tp {}{}{}; {} micro-batch{}{}{}{}; batch {} x T {}; {}{}{}; {} steps; {}{}{}", p.dp,
      toString(p.dpMode), p.pp, cpFactor(o), p.tp, p.sequenceParallel && p.tp > 1 ? " +sp" : "",
      p.ep > 1 ? fmt::format(", ep {}", p.ep) : "", p.microBatches, p.microBatches == 1 ? "" : "es",
      p.pp > 1 ? ", schedule " : "", p.pp > 1 ? pipeline::scheduleName(p.schedule) : "",
      p.chunks > 1        ? fmt::format(" ({} chunks)", p.chunks)
      : p.extraWarmup > 0 ? fmt::format(" (+{} warm-up forwards)", p.extraWarmup)
                          : "",
      o.optim.batch, o.model.cfg.seqLen, toString(o.precision.precision),
      usesFusedWgrad(o) ? ", weight gradients summed in the GEMM" : "",
      o.precision.fusedKernels ? ", fused kernels" : "", o.optim.steps, optim::describe(o.optim.lr),
      o.precision.recompute != nn::Recompute::None ? fmt::format("; recompute {}", nn::toString(o.precision.recompute))
                                                   : "",
      overlapSet ? fmt::format("; overlap: {} forward pieces, {} SMs kept free{}", ov.forwardChunks, ov.smCarveout,
                               ov.ring ? ", ring" : "")
                 : "");
}

}  // namespace tessera::train
