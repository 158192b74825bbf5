#include "comm/watchdog/fingerprint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "tessera/common/error.h"
#include "common/host.h"

namespace tessera::fingerprint {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

const std::string& processId() {
  static const std::string id = fmt::format("{}:{}", hostName(), ::getpid());
  return id;
}

// What a rank called, as compared across the ranks of one group (the group is the same by
// construction of the namespace, and its name is not compared: callers may name it per rank).
std::string print(const OpInfo& i) {
  return fmt::format("{} #{}{}{}{}", i.op, i.seq, i.detail.empty() ? "" : " (", i.detail, i.detail.empty() ? "" : ")");
}

std::string lastCallOf(const StorePtr& store, const std::string& ns, int rank) {
  std::string who = fmt::format("tessera-debug/{}/who/{}", ns, rank);
  if (!store->check({who})) return "it never joined this group";
  std::string proc = text(store->get(who));
  std::string last = "tessera-debug/proc/" + proc;
  return fmt::format("process {}; its last collective call was {}", proc,
                     store->check({last}) ? text(store->get(last)) : "none yet");
}

}  // namespace

namespace {
std::atomic<bool> g_enabled{false};
}  // namespace

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void setEnabled(bool on) { g_enabled = on; }

void join(const StorePtr& store, const std::string& ns, int rank) {
  store->set(fmt::format("tessera-debug/{}/who/{}", ns, rank), bytes(processId()));
}

void check(const StorePtr& store, const std::string& ns, const OpInfo& i, std::chrono::milliseconds timeout) {
  const std::string mine = print(i);
  const std::string base = fmt::format("tessera-debug/{}/op/", ns);
  store->set("tessera-debug/proc/" + processId(), bytes(fmt::format("{} on group '{}'", mine, i.group)));
  store->set(fmt::format("{}{}/{}", base, i.seq, i.rank), bytes(mine));
  if (i.seq > 2) store->deleteKey(fmt::format("{}{}/{}", base, i.seq - 2, i.rank));

  std::vector<std::string> keys;
  for (int r = 0; r < i.groupSize; ++r) keys.push_back(fmt::format("{}{}/{}", base, i.seq, r));
  try {
    store->wait(keys, timeout);
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < i.groupSize; ++r) {
      if (!store->check({keys[r]})) missing += fmt::format("\n  rank {}: {}", r, lastCallOf(store, ns, r));
    }
    throw Error(fmt::format("tessera debug check: {} on group '{}' (rank {} of {}): not every rank of the group "
                            "called it within {:.1f} s; missing:{}",
                            mine, i.group, i.rank, i.groupSize, timeout.count() / 1000.0,
                            missing.empty() ? " (they arrived just now; raise the timeout)" : missing));
  }
  std::vector<std::string> calls;
  bool same = true;
  for (int r = 0; r < i.groupSize; ++r) {
    calls.push_back(text(store->get(keys[r])));
    same = same && calls[r] == mine;
  }
  if (same) return;
  std::string who;
  for (int r = 0; r < i.groupSize; ++r) {
    who += fmt::format("\n  rank {}{}: {}", r, r == i.rank ? " (this rank)" : "", calls[r]);
  }
  throw Error(fmt::format("tessera debug check: the ranks of group '{}' disagree on collective #{}:{}", i.group,
                          i.seq, who));
}

}  // namespace tessera::fingerprint
