#pragma once
// Minimal fmt logging to stderr, one line per call, prefixed with "[tessera rank N]".
// Messages below the level (default info; Settings::logLevel) are dropped. Thread-safe.
#include <fmt/format.h>

#include <string>

namespace tessera::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

Level level();
void setLevel(Level lvl);
// Rank shown in the prefix; -1 (the default) until bootstrap knows it.
void setRank(int rank);
int rank();
void write(Level lvl, const std::string& msg);

template <typename... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Debug) write(Level::Debug, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Info) write(Level::Info, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::Warn) write(Level::Warn, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void error(fmt::format_string<A...> f, A&&... a) {
  write(Level::Error, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace tessera::log
