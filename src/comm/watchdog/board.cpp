#include "comm/watchdog/board.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/watchdog/process_state.h"
#include "common/bounded.h"
#include "tessera/common/error.h"
#include "common/host.h"

namespace tessera::board {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxMessage = 4000;  // bytes of a message kept on the board
constexpr auto kPoll = std::chrono::milliseconds(50);

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }
std::string key(const char* what, int rank) { return fmt::format("{}/{}", what, rank); }
std::string clip(const std::string& m) { return m.size() <= kMaxMessage ? m : m.substr(0, kMaxMessage) + " [...]"; }

struct State {
  StorePtr store;  // "<prefix>/board/"; null: closed
  int rank = -1, world = 0;
  std::string me;     // "rank r (host h, pid p)"
  std::string owner;  // who runs the store
  bool hostsStore = false;
  Options o;
  bool published = false;       // error/<rank> written (or tried)
  bool sawCommFailure = false;  // later errors of this process are consequences, not causes
  std::string unreachable;      // why the store cannot be used; "" while it can
  std::vector<int> silent;      // ranks this process found silent
  bool explaining = false;
  std::shared_future<std::string> explanation;
};
struct Board : State {
  std::mutex mu;
};

Board& board() {
  static auto* b = new Board();  // leaked: used from detached threads and at exit
  return *b;
}

// "rank r (host h, pid p)" from proc/<r>'s "host pid".
std::string describeRank(int r, const std::string& proc, std::string* host = nullptr, long* pid = nullptr) {
  const auto space = proc.rfind(' ');
  if (proc.empty() || space == std::string::npos) return fmt::format("rank {} (never joined the board)", r);
  if (host) *host = proc.substr(0, space);
  if (pid) *pid = std::strtol(proc.c_str() + space + 1, nullptr, 10);
  return fmt::format("rank {} (host {}, pid {})", r, proc.substr(0, space), proc.substr(space + 1));
}

std::string storeGone(const State& b, const std::string& why) {
  const bool late = why.rfind("no answer", 0) == 0;
  const bool rank = b.owner.rfind("rank ", 0) == 0;
  const auto who = rank ? b.owner.substr(0, b.owner.find(' ', 5)) : std::string("its host");
  std::string state = late ? "stalled (stopped or hung)" : "dead";
  const auto at = b.owner.find("(host ");
  if (at != std::string::npos) {  // "rank 0 (host h, pid p)": what this host can tell of it
    const auto comma = b.owner.find(", pid ", at);
    if (comma != std::string::npos) {
      const auto host = b.owner.substr(at + 6, comma - at - 6);
      if (host == hostName()) {
        state += ": " + processState(host, std::strtol(b.owner.c_str() + comma + 6, nullptr, 10)).text;
      }
    }
  }
  return fmt::format("the job's store, run by {}, is unreachable ({}): {} is probably {}", b.owner, why, who, state);
}

struct Findings {
  std::string cause;
  std::vector<std::pair<int, std::string>> silent;  // rank, its proc/<r>
  int64_t reported = 0;
};

// In the store (bounded by the caller): this rank's report (when `report`), then, for at most
// `window`, the cause some rank published, else the ranks that did not report and their proc entry.
Findings readFindings(c10d::Store& s, int rank, int world, const std::string& entry, bool report,
                      std::chrono::milliseconds window) {
  if (report) {
    s.set(key("error", rank), bytes(entry));
    s.add("count", 1);
  }
  Findings f;
  const auto until = Clock::now() + window;
  for (;;) {
    f.reported = s.add("count", 0);
    if (s.check({"cause"})) {
      f.cause = text(s.get("cause"));
      break;
    }
    if (f.reported >= world || Clock::now() >= until) break;
    std::this_thread::sleep_for(kPoll);
  }
  for (int r = 0; f.cause.empty() && r < world; ++r) {
    if (r == rank || s.check({key("error", r)})) continue;
    f.silent.emplace_back(r, s.check({key("proc", r)}) ? text(s.get(key("proc", r))) : "");
  }
  s.set(key("done", rank), bytes("1"));
  return f;
}

// The ranks that did not report. Ranks that are gone or stopped are the cause; ranks merely alive
// and silent are usually blocked behind them (they fail once this rank ends), so they are named
// only without one. Remembers the certain ones in b.silent.
std::string describeSilent(State& b, const Findings& found, std::chrono::milliseconds window) {
  std::string certain, others;
  for (const auto& [r, proc] : found.silent) {
    std::string host;
    long pid = 0;
    const auto who = describeRank(r, proc, &host, &pid);
    const auto st = host.empty() ? ProcessState{"dead or stalled"} : processState(host, pid);
    auto& to = st.certain ? certain : others;
    to += fmt::format("{}{} did not report within {:.1f} s: {}", to.empty() ? "" : "; ", who, window.count() / 1e3,
                      st.text);
    if (st.certain) b.silent.push_back(r);
  }
  return "no rank published an error; " +
         (certain.empty() || others.empty()
              ? certain + others
              : fmt::format("{} (not reported yet either, probably blocked behind it: {})", certain, others));
}

}  // namespace

void open(const StorePtr& store, int rank, int world, const std::string& storeOwner, bool hostsStore,
          const Options& o) {
  auto s = prefixStore("board", store);
  const std::string mine = fmt::format("{} {}", hostName(), ::getpid());
  const auto held = text(s->compareSet(key("proc", rank), {}, bytes(mine)));
  TESSERA_CHECK(held == mine,
                "tessera: rank {} of this job's store is already held by {}: another job uses the same store "
                "(its port), or two processes were given rank {}",
                rank, describeRank(rank, held), rank);
  auto& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  static_cast<State&>(b) = State{};
  b.store = s;
  b.rank = rank;
  b.world = world;
  b.me = describeRank(rank, mine);
  b.owner = storeOwner;
  b.hostsStore = hostsStore;
  b.o = o;
}

void close() {
  auto& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  b.store.reset();
}

void publishError(const std::string& message, bool commFailure) {
  auto& b = board();
  std::unique_lock<std::mutex> l(b.mu);
  if (!b.store || b.published || !b.unreachable.empty()) return;
  b.published = true;
  const bool cause = !commFailure && !b.sawCommFailure;
  const auto entry = fmt::format("{}: {}", b.me, clip(message));
  auto s = b.store;
  const int rank = b.rank;
  const auto deadline = b.o.storeDeadline;
  l.unlock();
  auto why = runBounded(deadline, [s, rank, entry, cause] {
    // The cause before the count: a reader that sees every rank counted then sees the cause.
    s->set(key("error", rank), bytes(entry));
    if (cause) s->compareSet("cause", {}, bytes(entry));
    s->add("count", 1);
    s->set(key("done", rank), bytes("1"));
  });
  l.lock();
  if (!why.empty()) b.unreachable = why;
}

std::string explainCommFailure(const std::string& failure) {
  auto& b = board();
  std::unique_lock<std::mutex> l(b.mu);
  if (!b.store) return "";
  b.sawCommFailure = true;
  const auto bound = b.o.window + b.o.storeDeadline;
  if (b.explaining) {  // another thread explains this process's first failure: its text
    auto f = b.explanation;
    l.unlock();
    return f.wait_for(bound + std::chrono::seconds(1)) == std::future_status::ready ? f.get() : "";
  }
  b.explaining = true;
  std::promise<std::string> promise;
  b.explanation = promise.get_future().share();
  if (!b.unreachable.empty()) {
    auto t = storeGone(b, b.unreachable);
    promise.set_value(t);
    return t;
  }
  const bool report = !b.published;
  b.published = true;
  auto s = b.store;
  const int rank = b.rank, world = b.world;
  const auto entry = fmt::format("{}: {}", b.me, clip(failure));
  const auto window = b.o.window;
  l.unlock();

  auto found = std::make_shared<Findings>();
  auto why = runBounded(bound, [s, rank, world, entry, report, window, found] {
    *found = readFindings(*s, rank, world, entry, report, window);
  });

  std::string t;
  l.lock();
  if (!why.empty()) {
    b.unreachable = why;
    t = storeGone(b, why);
  } else if (!found->cause.empty()) {
    const auto colon = found->cause.find("): ");
    t = colon == std::string::npos ? found->cause
                                   : fmt::format("{}) failed first: {}", found->cause.substr(0, colon),
                                                 found->cause.substr(colon + 3));
  } else if (found->silent.empty()) {
    t = "no rank published another cause: every rank reported a communication failure";
  } else {
    t = describeSilent(b, *found, window);
  }
  promise.set_value(t);
  return t;
}

void lingerForPeers() {
  auto& b = board();
  std::unique_lock<std::mutex> l(b.mu);
  if (!b.store || !b.hostsStore || !b.unreachable.empty()) return;
  std::vector<int> wait;
  for (int r = 0; r < b.world; ++r) {
    if (r != b.rank && std::find(b.silent.begin(), b.silent.end(), r) == b.silent.end()) wait.push_back(r);
  }
  auto s = b.store;
  const auto linger = b.o.linger;
  const auto bound = linger + b.o.storeDeadline;
  l.unlock();
  runBounded(bound, [s, wait, linger] {
    const auto until = Clock::now() + linger;
    for (int r : wait) {
      while (!s->check({key("done", r)}) && Clock::now() < until) std::this_thread::sleep_for(kPoll);
    }
  });
}

void publishFatal(const std::exception& e) {
  publishError(e.what(), dynamic_cast<const CommError*>(&e) != nullptr);
  lingerForPeers();
}

std::chrono::milliseconds explainBound() {
  auto& b = board();
  std::lock_guard<std::mutex> l(b.mu);
  return b.o.window + b.o.storeDeadline + std::chrono::seconds(1);
}

}  // namespace tessera::board
