// Values of train_gpt's flags; see options_kinds.h.
#include "train/flag_kinds.h"

#include <cmath>
#include <exception>
#include <utility>

namespace tessera::train {

void refuse(const std::string& flag, const std::string& v, const std::string& what) {
  throw UsageError(fmt::format("train_gpt: {} expects {}, got '{}'", flag, what, v));
}

namespace {
// The whole of `v` as read by `read` (std::stoll, std::stod), else refused.
template <typename T, typename Read>
T whole(const std::string& flag, const std::string& v, const std::string& what, Read read) {
  try {
    size_t n = 0;
    const T x = read(v, &n);
    if (n == v.size()) return x;
  } catch (const std::exception&) {
  }
  refuse(flag, v, what);
}
}  // namespace

int64_t integer(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  const std::string what = hi == kNoMax || hi == INT_MAX ? fmt::format("an integer >= {}", lo)
                                                         : fmt::format("an integer in [{}, {}]", lo, hi);
  const auto x = whole<int64_t>(flag, v, what, [](const std::string& s, size_t* n) { return std::stoll(s, n); });
  if (x < lo || x > hi) refuse(flag, v, what);
  return x;
}

double number(const std::string& flag, const std::string& v, double lo, bool open) {
  const std::string what = std::isnan(lo) ? "a number" : fmt::format("a number {} {}", open ? ">" : ">=", lo);
  const auto x = whole<double>(flag, v, what, [](const std::string& s, size_t* n) { return std::stod(s, n); });
  if (!std::isfinite(x) || (!std::isnan(lo) && (open ? x <= lo : x < lo))) refuse(flag, v, what);
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

}  // namespace tessera::train
