// A run's checkpoints under one root (series.h): step-<N> directories, `latest`, keep-last, and
// the choice of what to resume from. The rules and their reasons: docs/design/checkpoints.md.
#include "tessera/checkpoint/series.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "checkpoint/files.h"
#include "checkpoint/opened.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/comm/settings.h"
#include "tessera/common/error.h"
#include "tessera/common/log.h"

namespace tessera::checkpoint {
namespace fs = std::filesystem;

namespace {

// The step of a directory named step-<digits> (nothing after them), else -1.
int64_t stepOfName(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(5));
}

struct StepEntry {
  int64_t step;
  fs::path dir;
};

// The step-<N> directories under `root`, newest first.
std::vector<StepEntry> stepDirs(const fs::path& root) {
  std::vector<StepEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = stepOfName(e.path().filename().string());
    if (s >= 0 && e.is_directory(ec)) out.push_back({s, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const StepEntry& a, const StepEntry& b) { return a.step > b.step; });
  return out;
}

// Files only a checkpoint writes: a directory holding one is a checkpoint, complete or not.
bool holdsCheckpointFiles(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "metadata.pt", ec) || fs::exists(dir / "metadata.sum", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0) return true;
  }
  return false;
}

std::string readLatest(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  if (in) std::getline(in, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  return name;
}

// The complete checkpoint at `dir` or, after an interrupted save of the same directory, at
// <dir>.old; "" and the reasons otherwise.
std::string completeAt(const fs::path& dir, std::string& why) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    why = whyIncomplete(dir.string());
    if (why.empty()) return dir.string();
  } else {
    why = "it is missing";
  }
  const fs::path old = dir.string() + ".old";
  if (fs::exists(old, ec) && whyIncomplete(old.string()).empty()) {
    why = fs::exists(dir, ec) ? fmt::format("{} is incomplete ({}); using {}", dir.string(), why, old.string())
                              : fmt::format("{} is missing (a save was interrupted between its renames); using {}",
                                            dir.string(), old.string());
    return old.string();
  }
  return "";
}

// (Not readMetadata: that resolves `dir` through find() again.)
int64_t savedStep(const std::string& dir) { return detail::openExact(dir).meta.at("step").toInt(); }

std::optional<Found> findInSeries(const fs::path& root, const std::vector<StepEntry>& steps) {
  std::vector<std::string> passed;  // newer candidates that are not complete
  const std::string latest = readLatest(root);
  std::error_code ec;
  if (!latest.empty() && !fs::exists(root / latest, ec) && !fs::exists(root / (latest + ".old"), ec)) {
    passed.push_back(fmt::format("{} (named by {}): it is missing", latest, (root / "latest").string()));
  }
  for (const auto& s : steps) {
    std::string why;
    const std::string dir = completeAt(s.dir, why);
    if (dir.empty()) {
      passed.push_back(fmt::format("{}: {}", s.dir.filename().string(), why));
      continue;
    }
    Found f{dir, savedStep(dir), ""};
    if (dir != s.dir.string()) passed.push_back(why);
    if (!passed.empty()) {
      f.note = fmt::format("passed over newer checkpoints that cannot be read: {}; using {} (step {})",
                           fmt::join(passed, "; "), dir, f.step);
    }
    return f;
  }
  // No complete step directory: a single-directory checkpoint of older tessera at the root itself.
  std::string why;
  if (const std::string dir = completeAt(root, why); !dir.empty() && holdsCheckpointFiles(dir)) {
    return Found{dir, savedStep(dir),
                 passed.empty()
                     ? ""
                     : fmt::format("no step directory is complete ({}); using {}", fmt::join(passed, "; "), dir)};
  }
  throw Error(fmt::format(
      "checkpoint: {} holds checkpoints but none is complete, so nothing was resumed: {}. Restore the missing "
      "files, or move the directory aside to start afresh",
      root.string(), fmt::join(passed, "; ")));
}

}  // namespace

std::string stepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format("step-{}", step)).string();
}

std::string whyIncomplete(const std::string& dirName) {
  const fs::path dir(dirName);
  std::error_code ec;
  if (!fs::exists(dir / "metadata.pt", ec)) return fmt::format("{} is missing", (dir / "metadata.pt").string());
  try {
    const auto o = detail::openExact(dir);
    for (const auto& kv : o.meta.at("files").toGenericDict()) {
      const fs::path f = dir / kv.key().toStringRef();
      const int64_t want = kv.value().toGenericDict().at("bytes").toInt();
      if (!fs::exists(f, ec)) return fmt::format("{} is missing", f.string());
      const auto have = static_cast<int64_t>(fs::file_size(f, ec));
      if (ec || have != want) {
        return fmt::format("{} is truncated or corrupted: {} bytes, the metadata says {}", f.string(), have, want);
      }
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::optional<Found> find(const std::string& dirName) {
  const fs::path root(dirName);
  std::error_code ec;
  const bool exists = fs::is_directory(root, ec);
  if (exists) {
    const auto steps = stepDirs(root);
    if (!steps.empty() || fs::exists(root / "latest", ec)) return findInSeries(root, steps);
  }
  std::string why;
  if (const std::string dir = completeAt(root, why); !dir.empty()) {
    return Found{dir, savedStep(dir), dir == dirName ? "" : why};
  }
  if (exists && holdsCheckpointFiles(root)) {
    throw Error(fmt::format(
        "checkpoint: {} is not a complete checkpoint, so nothing was resumed: {}{}. Restore the missing files, or "
        "move the directory aside to start afresh",
        dirName, whyIncomplete(dirName),
        fs::exists(dirName + ".old", ec) ? fmt::format("; {}.old is not complete either", dirName) : ""));
  }
  return std::nullopt;
}

namespace {
void replaceFile(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  files::writeDurably(tmp, std::vector<char>(text.begin(), text.end()));
  fs::rename(tmp, p);
}
}  // namespace

void commitStep(const std::string& rootName, int64_t step, int keepLast,
                const std::map<std::string, std::string>& rootFiles) {
  const fs::path root(rootName);
  const std::string name = fmt::format("step-{}", step);
  TESSERA_CHECK(whyIncomplete((root / name).string()).empty(), "checkpoint: {} is not complete; latest not moved",
                (root / name).string());
  for (const auto& [file, text] : rootFiles) {
    TESSERA_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "latest" && stepOfName(file) < 0,
                  "checkpoint: '{}' cannot be a file of the checkpoints' directory", file);
    replaceFile(root / file, text);
  }
  injectFault(settings(), "checkpoint-before-latest", 0, "checkpoint");  // tests: killed before `latest` moves
  replaceFile(root / "latest", name + "\n");
  files::syncDir(root);
  // Older complete checkpoints beyond the newest keepLast go; so do incomplete older ones (the one
  // just committed supersedes them). Later steps of an earlier attempt stay: this run saves them again.
  int kept = 0;
  for (const auto& s : stepDirs(root)) {
    if (s.step >= step) {
      kept += s.step == step ? 1 : 0;
      continue;
    }
    const bool complete = whyIncomplete(s.dir.string()).empty();
    if (complete && (keepLast <= 0 || kept < keepLast)) {
      ++kept;
      continue;
    }
    files::removeTree(s.dir);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto n = e.path().filename().string();
    const auto dot = n.rfind('.');
    if (dot == std::string::npos || stepOfName(n.substr(0, dot)) < 0) continue;
    if (n.substr(dot) == ".tmp" || n.substr(dot) == ".old") files::removeTree(e.path());
  }
}

}  // namespace tessera::checkpoint
