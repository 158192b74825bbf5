#pragma once
// Parsers for SLURM's compressed list formats. Pure, local functions (no environment access);
// each throws tessera::Error naming `what` (the variable the text came from) and the text.
//
//   expandHostlist("node[01-03,07],gpu-a[1-2]")  → node01 node02 node03 node07 gpu-a1 gpu-a2
//   expandHostlist("rack[1-2]-n[1-2]")           → rack1-n1 rack1-n2 rack2-n1 rack2-n2
//   expandTasksPerNode("2(x3),1")                → 2 2 2 1
//
// Ranges keep the zero padding of their lower bound ("[08-10]" → 08 09 10). At most
// kMaxHosts names are produced, so a typo such as "n[1-999999999]" fails instead of
// exhausting memory.
//
// Header-only: src/CMakeLists.txt lists its sources explicitly; keeping this inline lets the
// SLURM bootstrap and its unit tests share it without touching that list.
#include <cctype>
#include <string>
#include <vector>

#include "tessera/common/error.h"

namespace tessera::slurm {

inline constexpr size_t kMaxHosts = 1 << 20;

namespace detail {

[[noreturn]] inline void fail(const char* what, const std::string& text, const std::string& why) {
  throw Error(fmt::format("{}='{}' is not a valid SLURM list: {}", what, text, why));
}

// Parses an unsigned decimal; fails on empty or non-digit text.
inline unsigned long long parseUnsigned(const char* what, const std::string& text, const std::string& s) {
  if (s.empty()) fail(what, text, "empty number");
  if (s.size() > 18) fail(what, text, fmt::format("number '{}' is too long", s));
  unsigned long long v = 0;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) fail(what, text, fmt::format("'{}' is not a number", s));
    v = v * 10 + static_cast<unsigned long long>(c - '0');
  }
  return v;
}

// "01-03,07" → {"01","02","03","07"}
inline std::vector<std::string> expandRanges(const char* what, const std::string& text, const std::string& body) {
  if (body.empty()) fail(what, text, "empty brackets");
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    std::string item = body.substr(pos, comma - pos);
    if (item.empty()) fail(what, text, "empty range inside brackets");
    size_t dash = item.find('-');
    std::string lo = item.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    unsigned long long a = parseUnsigned(what, text, lo), b = parseUnsigned(what, text, hi);
    if (a > b) fail(what, text, fmt::format("range '{}' runs backwards", item));
    if (b - a >= kMaxHosts || out.size() + (b - a) >= kMaxHosts)
      fail(what, text, fmt::format("more than {} hosts", kMaxHosts));
    for (unsigned long long v = a; v <= b; ++v) out.push_back(fmt::format("{:0{}}", v, lo.size()));
    pos = comma + 1;
  }
  return out;
}

// One host expression (no top-level commas), possibly with several bracket groups.
inline void expandOne(const char* what, const std::string& text, const std::string& expr,
                      std::vector<std::string>& out) {
  if (expr.empty()) fail(what, text, "empty host name");
  std::vector<std::string> partial{""};
  size_t pos = 0;
  while (pos < expr.size()) {
    size_t open = expr.find('[', pos);
    std::string lit = expr.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (lit.find(']') != std::string::npos) fail(what, text, "']' without '['");
    for (auto& p : partial) p += lit;
    if (open == std::string::npos) break;
    size_t close = expr.find(']', open);
    if (close == std::string::npos) fail(what, text, "'[' without ']'");
    auto values = expandRanges(what, text, expr.substr(open + 1, close - open - 1));
    if (partial.size() * values.size() > kMaxHosts) fail(what, text, fmt::format("more than {} hosts", kMaxHosts));
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial = std::move(next);
    pos = close + 1;
  }
  for (auto& p : partial) {
    if (out.size() >= kMaxHosts) fail(what, text, fmt::format("more than {} hosts", kMaxHosts));
    out.push_back(std::move(p));
  }
}

}  // namespace detail

// Expands a SLURM hostlist expression into host names, in order.
inline std::vector<std::string> expandHostlist(const std::string& text, const char* what = "hostlist") {
  std::vector<std::string> out;
  if (text.empty()) detail::fail(what, text, "empty");
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    char c = i < text.size() ? text[i] : ',';
    if (std::isspace(static_cast<unsigned char>(c))) detail::fail(what, text, "contains whitespace");
    if (c == '[') {
      if (++depth > 1) detail::fail(what, text, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) detail::fail(what, text, "']' without '['");
    } else if (c == ',' && depth == 0) {
      detail::expandOne(what, text, text.substr(start, i - start), out);
      start = i + 1;
    }
  }
  if (depth != 0) detail::fail(what, text, "'[' without ']'");
  return out;
}

// Expands SLURM's tasks-per-node list ("2(x3),1") into one count per node, in node order.
inline std::vector<int> expandTasksPerNode(const std::string& text, const char* what = "SLURM_TASKS_PER_NODE") {
  std::vector<int> out;
  if (text.empty()) detail::fail(what, text, "empty");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    std::string count = item, reps = "1";
    size_t paren = item.find('(');
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')')
        detail::fail(what, text, fmt::format("'{}' is not of the form N(xM)", item));
      count = item.substr(0, paren);
      reps = item.substr(paren + 2, item.size() - paren - 3);
    }
    auto n = detail::parseUnsigned(what, text, count);
    auto r = detail::parseUnsigned(what, text, reps);
    if (n == 0 || n > 1u << 20) detail::fail(what, text, fmt::format("task count {} out of range", n));
    if (r == 0 || r + out.size() > kMaxHosts) detail::fail(what, text, fmt::format("repeat count {} out of range", r));
    out.insert(out.end(), static_cast<size_t>(r), static_cast<int>(n));
    pos = comma + 1;
  }
  return out;
}

}  // namespace tessera::slurm
