#include "comm/bootstrap/job.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "common/bounded.h"
#include "tessera/common/log.h"
#include "tessera/common/error.h"
#include "common/host.h"

namespace tessera {
namespace {

constexpr const char* kJobKey = "tessera-job";

// One "name=value" per line: launcher, id, world, prefix, host, pid.
using Identity = std::map<std::string, std::string>;

Identity identityOf(const LaunchInfo& l) {
  return {{"launcher", l.launcher},        {"id", l.jobId},         {"world", std::to_string(l.worldSize)},
          {"prefix", l.storePrefix},       {"host", hostName()},    {"pid", std::to_string(::getpid())}};
}

std::string encode(const Identity& j) {
  std::string t;
  for (const auto& [k, v] : j) t += k + "=" + v + "\n";
  return t;
}

Identity decode(const std::vector<uint8_t>& b) {
  Identity j;
  std::istringstream in(std::string(b.begin(), b.end()));
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) j[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return j;
}

std::string field(const Identity& j, const char* k) {
  auto it = j.find(k);
  return it == j.end() ? "?" : it->second;
}

// "launcher torchrun, run id 'x', world 3, keys under 'tessera'"
std::string describe(const Identity& j) {
  const auto id = field(j, "id");
  return fmt::format("launcher {}, {}, world {}, keys under '{}'", field(j, "launcher"),
                     id.empty() ? "no run id" : fmt::format("run id '{}'", id), field(j, "world"),
                     field(j, "prefix"));
}

std::string rank0(const Identity& j) {
  return fmt::format("rank 0 (host {}, pid {})", field(j, "host"), field(j, "pid"));
}

// Where rank 0 of job `l` says that it could not host the store (its identity and "why").
std::string hostFailedKey(const LaunchInfo& l) {
  return fmt::format("tessera-job-failed/{}/{}/{}/{}", l.launcher, l.jobId, l.worldSize, l.storePrefix);
}

std::vector<uint8_t> bytesOf(const std::string& t) { return {t.begin(), t.end()}; }

// Polls (check(), never a wait with a timeout, which may desynchronise a c10d client) until the store
// holds rank 0's identity; throws at once when rank 0 left word that it could not host the store.
void awaitJob(c10d::Store& root, const LaunchInfo& l, std::chrono::milliseconds timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto failedKey = hostFailedKey(l);
  auto pause = std::chrono::milliseconds(10);
  bool told = false;
  while (!root.check({kJobKey})) {
    if (root.check({failedKey})) {
      const auto j = decode(root.get(failedKey));
      throw Error(fmt::format("the store at {}:{} is not this job's: this job's {} could not start its store there: "
                              "{}",
                              l.storeHost, l.storePort, rank0(j), field(j, "why")));
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (waited > timeout) {
      throw Error(fmt::format("no tessera job announced itself in the store at {}:{} within {:.1f} s: this job's "
                              "rank 0 did not start its store there, or another program holds port {}",
                              l.storeHost, l.storePort, timeout.count() / 1e3, l.storePort));
    }
    if (!told && waited > std::chrono::seconds(10)) {
      told = true;
      log::info("tessera::init: rank {} waits for rank 0 to announce this job in the store at {}:{} (up to {:.0f} s)",
                l.rank, l.storeHost, l.storePort, timeout.count() / 1e3);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

}  // namespace

void announceJob(c10d::Store& root, const LaunchInfo& l) {
  const auto t = encode(identityOf(l));
  root.set(kJobKey, std::vector<uint8_t>(t.begin(), t.end()));
}

std::string checkJob(c10d::Store& root, const LaunchInfo& l, std::chrono::milliseconds timeout) {
  awaitJob(root, l, timeout);
  const auto theirs = decode(root.get(kJobKey));
  const auto mine = identityOf(l);
  for (const char* k : {"launcher", "id", "world", "prefix"}) {
    if (field(theirs, k) == field(mine, k)) continue;
    throw Error(fmt::format("the store at {}:{} belongs to another job: its {} runs it ({}); this process is rank {} "
                            "of a job with {}. Another job holds port {}: give each job a port of its own "
                            "(MASTER_PORT, TESSERA_STORE_PORT)",
                            l.storeHost, l.storePort, rank0(theirs), describe(theirs), l.rank, describe(mine),
                            l.storePort));
  }
  return rank0(theirs);
}

std::string describePortHolder(uint16_t port, const std::string& error, const LaunchInfo* l) {
  std::string lower = error;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (port == 0 || lower.find("already in use") == std::string::npos) return "";
  auto found = std::make_shared<std::string>();
  std::string failedKey, mine;
  if (l) {
    failedKey = hostFailedKey(*l);
    mine = encode(identityOf(*l));
  }
  const auto why = runBounded(std::chrono::seconds(3), [port, found, failedKey, mine] {
    auto s = connectStore("127.0.0.1", port, std::chrono::seconds(2));
    try {
      s->wait({kJobKey}, std::chrono::seconds(1));
    } catch (const std::exception&) {
      *found = fmt::format("another process holds port {} (it answers as a store, but no tessera job announced "
                           "itself there)", port);
      // This job's other ranks reached the same store and wait there for rank 0: tell them.
      if (!failedKey.empty()) {
        s = connectStore("127.0.0.1", port, std::chrono::seconds(1));  // the timed-out wait left the first unusable
        s->set(failedKey, bytesOf(mine + "why=" + *found + "; give this job a port of its own (MASTER_PORT, "
                                                            "TESSERA_STORE_PORT)\n"));
      }
      return;
    }
    const auto j = decode(s->get(kJobKey));
    *found = fmt::format("another tessera job holds port {}: its {} runs its store ({})", port, rank0(j), describe(j));
  });
  const auto holder =
      why.empty() ? *found : fmt::format("another process holds port {} (not a tessera store: {})", port, why);
  return holder + "; give this job a port of its own (MASTER_PORT, TESSERA_STORE_PORT)";
}

}  // namespace tessera
