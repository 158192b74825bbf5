// Values of train_gpt's flags; see options_kinds.h.
#include "options_kinds.h"

#include <cmath>
#include <exception>
#include <utility>

namespace tessera::gpt {

void refuse(const std::string& flag, const std::string& v, const std::string& what) {
  throw UsageError(fmt::format("train_gpt: {} expects {}, got '{}'", flag, what, v));
}

int64_t integer(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  const std::string what = hi == kNoMax || hi == INT_MAX ? fmt::format("an integer >= {}", lo)
                                                         : fmt::format("an integer in [{}, {}]", lo, hi);
  size_t n = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &n);
  } catch (const std::exception&) {
    refuse(flag, v, what);
  }
  if (n != v.size() || x < lo || x > hi) refuse(flag, v, what);
  return x;
}

double number(const std::string& flag, const std::string& v, double lo, bool open) {
  const std::string what = std::isnan(lo) ? "a number" : fmt::format("a number {} {}", open ? ">" : ">=", lo);
  size_t n = 0;
  double x = 0;
  try {
    x = std::stod(v, &n);
  } catch (const std::exception&) {
    refuse(flag, v, what);
  }
  if (n != v.size() || !std::isfinite(x) || (!std::isnan(lo) && (open ? x <= lo : x < lo))) refuse(flag, v, what);
  return x;
}

bool switchValue(const std::string& flag, const std::string& v) {
  for (const char* on : {"true", "on", "yes", "1"}) {
    if (v == on) return true;
  }
  for (const char* off : {"false", "off", "no", "0"}) {
    if (v == off) return false;
  }
  refuse(flag, v, fmt::format("no value (a switch) or one of on, off, true, false, yes, no, 1, 0 ({}=off)", flag));
}

std::string quoted(const std::string& s) { return s.find('"') == std::string::npos ? '"' + s + '"' : "'" + s + "'"; }

Flag make(std::string names, std::string value, std::string help) {
  Flag f;
  f.names = std::move(names);
  f.value = std::move(value);
  f.help = std::move(help);
  return f;
}

std::string Flag::flag() const { return names.substr(0, names.find(',')); }
std::string Flag::key() const { return flag().substr(2); }

}  // namespace tessera::gpt
