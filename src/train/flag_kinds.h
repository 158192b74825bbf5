#pragma once
// The kinds of flags, as builders of flags.h's Flag: integers and numbers in a
// range, text, switches, choices. Each builder takes the flag's names, its value's name and help,
// and `ref`, the field it sets (FIELD(model.cfg.d)); the Flag parses and checks a value (UsageError
// naming the flag and the value) and prints the field as TOML. Local; internal to src/train.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "train/flags.h"

// The field `f` of the options, as a generic lambda: one accessor for the const and the mutable.
#define FIELD(f) \
  [](auto& o) -> auto& { return o.f; }

namespace tessera::train {

constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

[[noreturn]] void refuse(const std::string& flag, const std::string& v, const std::string& what);
// The whole of `v` as an integer in [lo, hi] (hi kNoMax or INT_MAX: no upper bound said).
int64_t integer(const std::string& flag, const std::string& v, int64_t lo, int64_t hi);
// The whole of `v` as a finite number; `lo` NaN: any, else > lo (`open`) or >= lo.
double number(const std::string& flag, const std::string& v, double lo, bool open);
// A TOML string as CLI11's reader takes it back: one pair of quotes stripped, no escapes.
std::string quoted(const std::string& s);
Flag make(std::string names, std::string value, std::string help);

// parse(v), its tessera::Error (which names the choices) as a UsageError naming the flag.
template <typename Parse>
auto choice(const std::string& flag, const std::string& v, Parse parse) {
  try {
    return parse(v);
  } catch (const Error& e) {
    throw UsageError(fmt::format("train_gpt: {}: {}", flag, e.what()));
  }
}

template <typename Ref>
Flag integerFlag(std::string names, std::string value, std::string help, int64_t lo, int64_t hi, Ref ref) {
  Flag f = make(std::move(names), std::move(value), std::move(help));
  f.set = [flag = f.flag(), lo, hi, ref](Config& o, const std::string& v) {
    auto& x = ref(o);
    x = static_cast<std::remove_reference_t<decltype(x)>>(integer(flag, v, lo, hi));
  };
  f.get = [ref](const Config& o) { return fmt::format("{}", ref(o)); };
  return f;
}
template <typename Ref>
Flag numberFlag(std::string names, std::string value, std::string help, double lo, bool open, Ref ref) {
  Flag f = make(std::move(names), std::move(value), std::move(help));
  f.set = [flag = f.flag(), lo, open, ref](Config& o, const std::string& v) {
    ref(o) = number(flag, v, lo, open);
  };
  f.get = [ref](const Config& o) { return fmt::format("{}", ref(o)); };  // the shortest exact form
  return f;
}
template <typename Ref>
Flag textFlag(std::string names, std::string value, std::string help, Ref ref) {
  Flag f = make(std::move(names), std::move(value), std::move(help));
  f.set = [ref](Config& o, const std::string& v) { ref(o) = v; };
  f.get = [ref](const Config& o) { return quoted(ref(o)); };
  return f;
}
// A switch; `negated`: the flag turns the field off (--no-fused-wgrad).
template <typename Ref>
Flag switchFlag(std::string names, std::string help, bool negated, Ref ref) {
  Flag f = make(std::move(names), "", std::move(help));
  f.set = [flag = f.flag(), negated, ref](Config& o, const std::string& v) {
    ref(o) = switchValue(flag, v) != negated;
  };
  f.get = [negated, ref](const Config& o) { return ref(o) != negated ? "true" : "false"; };
  return f;
}
// `parse` a name into the field's value, `name` the way back.
template <typename Parse, typename Name, typename Ref>
Flag choiceFlag(std::string names, std::string value, std::string help, Parse parse, Name name, Ref ref) {
  Flag f = make(std::move(names), std::move(value), std::move(help));
  f.set = [flag = f.flag(), parse, ref](Config& o, const std::string& v) { ref(o) = choice(flag, v, parse); };
  f.get = [name, ref](const Config& o) { return quoted(name(ref(o))); };
  return f;
}
// A bool named by one of two words: `no` (false) or `yes` (true); `value` shows them (default first).
template <typename Ref>
Flag twoWordFlag(std::string names, std::string value, const char* no, const char* yes, std::string help, Ref ref) {
  std::string words = value;  // "on|off" -> "on or off", in the refusal
  if (const auto bar = words.find('|'); bar != std::string::npos) words.replace(bar, 1, " or ");
  Flag f = make(std::move(names), std::move(value), std::move(help));
  f.set = [flag = f.flag(), words, no, yes, ref](Config& o, const std::string& v) {
    if (v != no && v != yes) throw UsageError(fmt::format("train_gpt: {} takes {}, got '{}'", flag, words, v));
    ref(o) = v == yes;
  };
  f.get = [no, yes, ref](const Config& o) { return quoted(ref(o) ? yes : no); };
  return f;
}

// A comma-separated list of integers >= lo (the whole list, or a refusal saying `what`); `shown`:
// what --help says when the list is empty.
template <typename Ref>
Flag intListFlag(const char* name, const char* meta, const char* help, const char* shown, int64_t lo,
                 const char* what, Ref ref) {
  Flag f = make(name, meta, help);
  f.shown = shown;
  f.set = [=](Config& o, const std::string& v) {
    auto& out = ref(o);
    out.clear();
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        out.push_back(static_cast<int>(integer(name, item, lo, INT_MAX)));
      } catch (const UsageError&) {
        refuse(name, v, what);
      }
    }
    if (out.empty()) refuse(name, v, what);
  };
  f.get = [=](const Config& o) {
    const auto& in = ref(o);
    return in.empty() ? std::string() : quoted(fmt::format("{}", fmt::join(in, ",")));
  };
  return f;
}

// A shape flag: its default is the --model preset's (listed at the end of --help), not a number.
inline Flag ofPreset(Flag f) {
  f.shown = "the preset's";
  return f;
}

// The flag with the default --help shows, and left out of the config while the field holds its
// "auto" value `unset` (resolveLayout or the preset fills it in).
template <typename Ref>
Flag autoFlag(Flag f, std::string shown, int64_t unset, Ref ref) {
  f.shown = std::move(shown);
  f.get = [get = f.get, unset, ref](const Config& o) {
    return static_cast<int64_t>(ref(o)) == unset ? std::string() : get(o);
  };
  return f;
}

// The flags whose value is more than one field of one kind (compound_flags.cpp).
Flag layoutFlag();                    // --layout DPxPPxTP | DPxPPxCPxTP
Flag modelFlag();                     // --model PRESET
Flag fsdpPrefetchFlag();              // --fsdp-prefetch-mib N|auto
Flag fsdpKeepGatheredFlag();          // --fsdp-keep-gathered auto|on|off
Flag fsdpAccumulateFlag();            // --fsdp-accumulate auto|local|sharded
Flag fusedKernelsFlag(bool onGpu);    // --fused-kernels on|off|auto

}  // namespace tessera::train
