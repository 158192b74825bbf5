#include "comm/watchdog/fingerprint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
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
std::atomic<Mode> g_mode{Mode::Fingerprint};

const char* opName(int64_t op) {
  static const char* names[] = {"?", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                "all_to_all", "barrier"};
  return op >= 1 && op <= kBarrier ? names[op] : nullptr;
}

// "0, 2-4, 7"
std::string rankList(const std::vector<int>& rs) {
  std::string s;
  for (size_t k = 0; k < rs.size();) {
    size_t e = k;
    while (e + 1 < rs.size() && rs[e + 1] == rs[e] + 1) ++e;
    s += fmt::format("{}{}", s.empty() ? "" : ", ", e > k ? fmt::format("{}-{}", rs[k], rs[e]) : std::to_string(rs[k]));
    k = e + 1;
  }
  return s;
}
}  // namespace

Mode mode() { return g_mode.load(std::memory_order_relaxed); }
void setMode(Mode m) { g_mode = m; }
bool enabled() { return mode() == Mode::Detail; }

std::array<int64_t, kWords> make(Op op, uint64_t seq, const at::Tensor& t, int reduce, int root) {
  const int64_t dtype = t.defined() ? static_cast<int64_t>(t.scalar_type()) + 1 : 0;
  return {op | (dtype << 8) | (static_cast<int64_t>(reduce + 1) << 16), t.defined() ? t.numel() : 0, root,
          static_cast<int64_t>(seq)};
}

std::string describeCall(const int64_t* w) {
  const char* op = opName(w[0] & 0xff);
  if (!op) return fmt::format("a call this build does not know (fingerprint {:#x} {} {} {})", w[0], w[1], w[2], w[3]);
  if (w[0] == kBarrier) return op;
  const int64_t dtype = ((w[0] >> 8) & 0xff) - 1, reduce = ((w[0] >> 16) & 0xff) - 1;
  std::string s = fmt::format("{} of {} x {}", op, w[1], dtypeName(static_cast<c10::ScalarType>(dtype)));
  if (reduce >= 0) s += fmt::format(" ({})", toString(static_cast<ReduceOp>(reduce)));
  if (w[2] >= 0) s += fmt::format(" {} root {}", (w[0] & 0xff) == kBroadcast ? "from" : "to", w[2]);
  if ((w[0] & 0xff) == kAllGather) s += " per rank";
  return s;
}

std::string compare(const OpInfo& i, const int64_t* all) {
  const auto same = [](const int64_t* a, const int64_t* b) { return std::equal(a, a + kWords, b); };
  bool agree = true;
  for (int r = 0; r < i.groupSize && agree; ++r) agree = same(all + r * kWords, i.fingerprint.data());
  if (agree) return "";
  std::vector<std::vector<int>> groups;  // ranks with equal calls, in order of their first rank
  for (int r = 0; r < i.groupSize; ++r) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](auto& v) { return same(all + v[0] * kWords, all + r * kWords); });
    if (g == groups.end()) {
      groups.push_back({r});
    } else {
      g->push_back(r);
    }
  }
  std::string s = "the ranks called different collectives: ";
  for (size_t k = 0; k < groups.size(); ++k) {
    const auto& g = groups[k];
    const bool mine = std::find(g.begin(), g.end(), i.rank) != g.end();
    const int64_t* w = all + g[0] * kWords;
    s += fmt::format("{}{} {}{} called {}{}", k ? "; " : "", g.size() > 1 ? "ranks" : "rank", rankList(g),
                     mine ? (g.size() > 1 ? " (this rank among them)" : " (this rank)") : "", describeCall(w),
                     w[3] != static_cast<int64_t>(i.seq) ? fmt::format(" as its collective #{}", w[3]) : "");
  }
  return s;
}

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
