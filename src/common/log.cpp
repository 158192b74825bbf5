#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace tessera::log {
namespace {
std::atomic<int> g_rank{-1};
std::mutex g_mu;

Level parseLevel() {
  const char* v = std::getenv("TESSERA_LOG_LEVEL");
  if (!v) return Level::Info;
  if (!std::strcmp(v, "debug")) return Level::Debug;
  if (!std::strcmp(v, "warn")) return Level::Warn;
  if (!std::strcmp(v, "error")) return Level::Error;
  return Level::Info;
}
}  // namespace

Level level() {
  static const Level lvl = parseLevel();
  return lvl;
}

void setRank(int rank) { g_rank = rank; }

void write(Level lvl, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mu);
  int r = g_rank.load();
  if (r >= 0) {
    fmt::print(stderr, "[tessera rank {} {}] {}\n", r, names[static_cast<int>(lvl)], msg);
  } else {
    fmt::print(stderr, "[tessera {}] {}\n", names[static_cast<int>(lvl)], msg);
  }
  std::fflush(stderr);
}

}  // namespace tessera::log
