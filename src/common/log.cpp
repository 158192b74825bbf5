#include "tessera/common/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace tessera::log {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{static_cast<int>(Level::Info)};
std::mutex g_mu;
}  // namespace

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void setLevel(Level lvl) { g_level = static_cast<int>(lvl); }

void setRank(int rank) { g_rank = rank; }
int rank() { return g_rank.load(); }

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
