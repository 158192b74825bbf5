#pragma once
// Named choices (enums spelled as words on command lines, in the environment and in Python):
// one table per enum gives both directions, so parsing and printing cannot drift apart.
//
//   constexpr Choices<Recompute, 3> kRecompute{"recompute mode",
//       {{{Recompute::None, "none"}, {Recompute::Full, "full"}, {Recompute::Selective, "selective"}}}};
//   Recompute r = kRecompute.parse(s);   // "unknown recompute mode 'x'; allowed: none, full, selective"
//   const char* n = kRecompute.name(r);
//
// Local, no state. parse() throws tessera::Error naming what was parsed, the value and every
// allowed word; an unknown value is never mapped to a default.
#include <array>
#include <string>
#include <utility>

#include "tessera/common/error.h"

namespace tessera {

template <typename E, size_t N>
struct Choices {
  const char* what;                               // "recompute mode", "TESSERA_LOG_LEVEL", ...
  std::array<std::pair<E, const char*>, N> names;  // each value once, in the order errors list them

  E parse(const std::string& s) const {
    for (const auto& [e, n] : names) {
      if (s == n) return e;
    }
    throw Error(fmt::format("unknown {} '{}'; allowed: {}", what, s, allowed()));
  }
  const char* name(E e) const {
    for (const auto& [v, n] : names) {
      if (v == e) return n;
    }
    return "?";
  }
  // "none, full, selective"
  std::string allowed() const {
    std::string out;
    for (const auto& [e, n] : names) out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
  }
};

}  // namespace tessera
