// The flags whose value is more than one field of one kind (flag_kinds.h declares them): --layout
// sets dp, pp, (cp,) tp at once; --model a preset's whole shape; --fsdp-prefetch-mib,
// --fsdp-keep-gathered, --fsdp-accumulate and --fused-kernels take "auto" beside their values.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "common/choice.h"
#include "train/flag_kinds.h"

namespace tessera::train {

namespace {
constexpr Choices<OnOffAuto, 3> kOnOffAuto{
    "value", {{{OnOffAuto::On, "on"}, {OnOffAuto::Off, "off"}, {OnOffAuto::Auto, "auto"}}}};
constexpr Choices<FsdpAccumulate, 3> kFsdpAccumulate{
    "value",
    {{{FsdpAccumulate::Auto, "auto"}, {FsdpAccumulate::Local, "local"}, {FsdpAccumulate::Sharded, "sharded"}}}};
}  // namespace

const char* toString(OnOffAuto s) { return kOnOffAuto.name(s); }
const char* toString(FsdpAccumulate a) { return kFsdpAccumulate.name(a); }

Flag layoutFlag() {
  Flag f = make("--layout", "DPxPPxTP",
                "dp, pp and tp at once, e.g. 2x2x2 (DPxPPxCPxTP with context parallel); auto: the fastest layout "
                "tessera-plan predicts from --plan-calibration");
  f.set = [](Config& o, const std::string& v) {
    o.parallel.autoLayout = v == "auto";
    if (o.parallel.autoLayout) return;
    std::vector<int> n;
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, 'x');) {
      try {
        n.push_back(static_cast<int>(integer("--layout", item, 1, INT_MAX)));
      } catch (const UsageError&) {
        n.clear();
        break;
      }
    }
    if (n.size() != 3 && n.size() != 4) refuse("--layout", v, "DPxPPxTP or DPxPPxCPxTP with each >= 1 (e.g. 2x2x2)");
    o.parallel.dp = n[0], o.parallel.pp = n[1], o.parallel.tp = n.back();
    o.parallel.cp = n.size() == 4 ? n[2] : 1;
  };
  return f;  // no get: the config gives dp, pp, cp and tp
}

Flag modelFlag() {
  Flag f = make("--model", "PRESET", "model preset (listed below)");
  f.set = [](Config& o, const std::string& v) {
    const auto names = models::presetNames();
    if (std::find(names.begin(), names.end(), v) == names.end()) {
      throw UsageError(fmt::format("train_gpt: --model: unknown preset '{}'; allowed: {}", v, fmt::join(names, ", ")));
    }
    o.model.preset = v;
    o.model.cfg = models::presetConfig(v);
  };
  // A model from --init-from-hf or the checkpoint (no preset): left out, those flags carry it.
  f.get = [](const Config& o) {
    const auto names = models::presetNames();
    return std::find(names.begin(), names.end(), o.model.preset) == names.end() ? std::string()
                                                                                : quoted(o.model.preset);
  };
  return f;
}

// "auto" (stored as -1): the budget sized from the units (parallelize.cpp, autoPrefetchBudget).
Flag fsdpPrefetchFlag() {
  Flag f = make("--fsdp-prefetch-mib", "N|auto",
                "FSDP: MiB of unsharded parameters alive at once (0: no prefetch; auto: at least one unit ahead)");
  f.shown = "auto";
  f.set = [flag = f.flag()](Config& o, const std::string& v) {
    o.parallel.fsdpPrefetchMiB = v == "auto" ? -1 : integer(flag, v, 0, kNoMax);
  };
  f.get = [](const Config& o) {
    return o.parallel.fsdpPrefetchMiB < 0 ? quoted("auto") : fmt::format("{}", o.parallel.fsdpPrefetchMiB);
  };
  return f;
}

// Resolved where the device is known (parallelize.cpp); config.h says what auto means.
Flag fsdpKeepGatheredFlag() {
  return choiceFlag(
      "--fsdp-keep-gathered", "auto|on|off",
      "FSDP with micro-batches: each unit gathered once per step and kept until the optimizer (auto: where all of "
      "them fit a quarter of the GPU's memory)",
      [](auto& v) { return kOnOffAuto.parse(v); }, [](OnOffAuto s) { return toString(s); },
      FIELD(parallel.fsdpKeepGathered));
}

Flag fsdpAccumulateFlag() {
  return choiceFlag(
      "--fsdp-accumulate", "auto|local|sharded",
      "FSDP with micro-batches: gradients added up in a float32 copy of the rank's model, reduce-scattered once a "
      "step (local), or reduce-scattered every micro-batch into the float32 shards (sharded: 1/dp of the memory); "
      "auto: sharded where the copy would take more than a quarter of the GPU's memory",
      [](auto& v) { return kFsdpAccumulate.parse(v); }, [](FsdpAccumulate a) { return toString(a); },
      FIELD(parallel.fsdpAccumulate));
}

Flag fusedKernelsFlag(bool onGpu) {
  Flag f = make("--fused-kernels", "on|off|auto", "tessera's fused kernels and multi-tensor AdamW (auto: on GPUs)");
  f.shown = "auto";
  f.set = [onGpu](Config& o, const std::string& v) {
    const auto s = choice("--fused-kernels", v, [](auto& x) { return kOnOffAuto.parse(x); });
    o.precision.fusedKernels = s == OnOffAuto::On || (s == OnOffAuto::Auto && onGpu);
  };
  f.get = [](const Config& o) { return quoted(o.precision.fusedKernels ? "on" : "off"); };
  return f;
}

}  // namespace tessera::train
